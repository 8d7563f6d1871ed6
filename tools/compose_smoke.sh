#!/usr/bin/env bash
# compose, run for real: the whole stack of compose.yaml in containers, one short sim job to the end.
#
#   tools/compose_smoke.sh            # or: make compose-smoke
#
# 1. docker: start `dockerd` (vfs storage, no iptables, no default bridge) unless one answers; install
#    docker.io, docker-compose, debootstrap, redis-tools and curl from apt when they are missing (root).
# 2. images: BASE_IMAGE (default: a local Debian bookworm + Python 3.11 built by tools/base_image.sh,
#    cached by tag), then docker/Dockerfile on top of it; redis runs from the same image (no registry).
# 3. compose up (every profile: control, trainer, rollout) on configs/compose_smoke.yaml, a short
#    configs/compose_sim.yaml, with compose.yaml's GPU reservations removed (tools/compose_cpu.py).
# 4. wait for `run_state.status == done`, then check from the host: redis-cli (accounting: lost 0,
#    the MessageQueue's consumer group, the audit stream) and the admin API (/status finished, /metrics).
# 5. tear down (containers, network, volumes) and stop the dockerd it started.
# Exit 0 only if the run finished with no sample lost. Logs: $SMOKE_DIR (default runs/compose_smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SMOKE_DIR=${SMOKE_DIR:-$ROOT/runs/compose_smoke}
BASE_IMAGE=${BASE_IMAGE:-dynsched-base:bookworm}
IMAGE_TAG=${IMAGE_TAG:-cpu-smoke}
CONFIG=${DYNSCHED_CONFIG:-compose_smoke.yaml}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-600}
PROJECT=${COMPOSE_PROJECT_NAME:-dynsched-smoke}
NAMESPACE=dynsched
mkdir -p "$SMOKE_DIR"
t_start=$SECONDS
log() { echo "[compose-smoke $((SECONDS - t_start))s] $*"; }
free_port() {
    "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# -- 1. docker --------------------------------------------------------------------------------------
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v curl >/dev/null || need+=(curl)
PYTHON=""  # any Python with PyYAML, for tools/compose_cpu.py: the project's venv, else Debian's python3-yaml
for candidate in "$ROOT/.venv/bin/python" python3 /usr/bin/python3; do
    if "$candidate" -c 'import yaml' 2>/dev/null; then PYTHON=$candidate; break; fi
done
[[ -n $PYTHON ]] || { need+=(python3-yaml); PYTHON=/usr/bin/python3; }
if ((${#need[@]})); then
    log "installing ${need[*]} (apt)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose); else COMPOSE=(docker-compose); fi

DOCKERD_PID=""
cleanup() {
    local rc=$?
    if [[ -n ${COMPOSE_FILE_CPU:-} ]]; then
        "${COMPOSE[@]}" -p "$PROJECT" -f "$COMPOSE_FILE_CPU" --project-directory "$ROOT" logs --no-color \
            >"$SMOKE_DIR/compose.log" 2>&1 || true
        "${COMPOSE[@]}" -p "$PROJECT" -f "$COMPOSE_FILE_CPU" --project-directory "$ROOT" down -v \
            --remove-orphans >/dev/null 2>&1 || true
    fi
    if [[ -n $DOCKERD_PID ]]; then
        log "stopping the dockerd it started (pid $DOCKERD_PID)"
        kill "$DOCKERD_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.2; done
    fi
    exit $rc
}
trap cleanup EXIT

if ! docker info >/dev/null 2>&1; then
    log "starting dockerd (log: $SMOKE_DIR/dockerd.log)"
    dockerd --storage-driver vfs --iptables=false --bridge=none >"$SMOKE_DIR/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 100); do docker info >/dev/null 2>&1 && break; sleep 0.3; done
    docker info >/dev/null 2>&1 || { tail -20 "$SMOKE_DIR/dockerd.log"; exit 1; }
fi

# -- 2. images --------------------------------------------------------------------------------------
if [[ $BASE_IMAGE == dynsched-base:* ]]; then
    tools/base_image.sh "$BASE_IMAGE"
fi
log "building dynsched:$IMAGE_TAG on $BASE_IMAGE"
# Host network for the build: the containers' own networks have no route out (no iptables NAT here).
docker build --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" -f docker/Dockerfile \
    -t "dynsched:$IMAGE_TAG" . >"$SMOKE_DIR/build.log" 2>&1 || { tail -30 "$SMOKE_DIR/build.log"; exit 1; }

# -- 3. compose up ----------------------------------------------------------------------------------
COMPOSE_FILE_CPU=$SMOKE_DIR/compose.cpu.yaml
"$PYTHON" tools/compose_cpu.py compose.yaml >"$COMPOSE_FILE_CPU"
REDIS_PORT=$(free_port)
ADMIN_PORT=$(free_port)
TOKEN_FILE=$SMOKE_DIR/admin_token  # the admin API listens beyond loopback in its container: a token
"$PYTHON" -c "import secrets; print(secrets.token_hex(16))" >"$TOKEN_FILE"
AUTH="Authorization: Bearer $(cat "$TOKEN_FILE")"
export DYNSCHED_ADMIN_TOKEN_PATH=$TOKEN_FILE
export DYNSCHED_CONFIG=$CONFIG DYNSCHED_IMAGE_TAG=$IMAGE_TAG DYNSCHED_DOCKERFILE=docker/Dockerfile \
    DYNSCHED_REDIS_IMAGE=dynsched:$IMAGE_TAG DYNSCHED_REDIS_PORT=$REDIS_PORT DYNSCHED_ADMIN_PORT=$ADMIN_PORT \
    COMPOSE_PROFILES=control,trainer,rollout
# vfs copies the whole image for every container: on a busy machine one create outlasts compose's 60 s.
export COMPOSE_HTTP_TIMEOUT=600 DOCKER_CLIENT_TIMEOUT=600
compose() { "${COMPOSE[@]}" -p "$PROJECT" -f "$COMPOSE_FILE_CPU" --project-directory "$ROOT" "$@"; }
compose down -v --remove-orphans >/dev/null 2>&1 || true
log "compose up ($CONFIG; redis on 127.0.0.1:$REDIS_PORT, admin API on 127.0.0.1:$ADMIN_PORT)"
compose up -d --no-build >"$SMOKE_DIR/compose_up.log" 2>&1 \
    || { cat "$SMOKE_DIR/compose_up.log"; exit 1; }

# -- 4. wait, then look from the host ---------------------------------------------------------------
rcli() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"; }
deadline=$((SECONDS + RUN_TIMEOUT_S))
status=""
last_log=0
until [[ $status == done ]]; do
    ((SECONDS < deadline)) || { log "FAIL: the run did not finish within ${RUN_TIMEOUT_S}s"; exit 1; }
    sleep 2
    status=$(rcli HGET "$NAMESPACE:run" status 2>/dev/null || true)
    if ((SECONDS - last_log >= 15)); then
        last_log=$SECONDS
        steps=$(rcli HGET "$NAMESPACE:trainer:state" global_steps 2>/dev/null || true)
        log "run ${status:-starting}: trainer at micro-step ${steps:-0}"
    fi
done
log "run done; inspecting it from the host"
{
    echo "== redis-cli HGETALL $NAMESPACE:accounting"; rcli HGETALL "$NAMESPACE:accounting"
    echo "== redis-cli XINFO GROUPS $NAMESPACE:mq"; rcli XINFO GROUPS "$NAMESPACE:mq"
    echo "== redis-cli XLEN $NAMESPACE:audit"; rcli XLEN "$NAMESPACE:audit"
    echo "== GET /status"; curl -sf -H "$AUTH" "http://127.0.0.1:$ADMIN_PORT/status"; echo
} >"$SMOKE_DIR/inspect.txt"
read -r fed generating queued trained dropped < <(for field in fed generating queued trained dropped; do
    v=$(rcli HGET "$NAMESPACE:accounting" "$field"); echo -n "${v:-0} "; done; echo)
lost=$((fed - generating - queued - trained - dropped))
log "samples: fed=$fed generating=$generating queued=$queued trained=$trained dropped=$dropped lost=$lost"
((fed > 0 && trained > 0)) || { log "FAIL: nothing was trained"; exit 1; }
((lost == 0)) || { log "FAIL: $lost sample(s) lost"; exit 1; }
groups=$(rcli XINFO GROUPS "$NAMESPACE:mq" | tr '\n' ' ')
[[ $groups == *trainer* ]] || { log "FAIL: the MessageQueue has no trainer group: $groups"; exit 1; }
((  $(rcli XLEN "$NAMESPACE:audit") > 0 )) || { log "FAIL: the audit stream is empty"; exit 1; }
status_json=$(curl -sf -H "$AUTH" "http://127.0.0.1:$ADMIN_PORT/status")
[[ $status_json == *'"finished":true'* ]] || { log "FAIL: /status does not say finished"; exit 1; }
code=$(curl -s -o /dev/null -w '%{http_code}' -H "$AUTH" -X POST "http://127.0.0.1:$ADMIN_PORT/activate")
[[ $code == 409 ]] || { log "FAIL: POST /activate after the run answered $code, not 409"; exit 1; }
metrics=$(curl -sf -H "$AUTH" "http://127.0.0.1:$ADMIN_PORT/metrics")  # not piped into grep -q: pipefail + SIGPIPE
grep -q '^dynamic_resource_mq_size ' <<<"$metrics" \
    || { log "FAIL: /metrics lacks dynamic_resource_mq_size"; exit 1; }
log "PASS in $((SECONDS - t_start))s (details: $SMOKE_DIR/inspect.txt)"
