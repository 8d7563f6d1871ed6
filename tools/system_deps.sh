#!/usr/bin/env bash
# Debian packages the test suite drives as real programs: prometheus (the scrape test), chromium and
# chromium-driver (the dashboard's browser test), docker-compose (`docker-compose config` of the GPU
# override: tests/test_compose_gpu.py, collected before the compose smoke test installs it). Installed
# with apt when missing and we are root; otherwise those tests skip and say why. (Docker's daemon is
# installed by tools/compose_smoke.sh itself.)
set -euo pipefail
need=()
command -v prometheus >/dev/null || need+=(prometheus)
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
command -v docker-compose >/dev/null || need+=(docker-compose)
((${#need[@]})) || exit 0
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "system_deps: missing ${need[*]} (not root or no apt): their tests will skip" >&2
    exit 0
fi
echo "system_deps: apt-get install ${need[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
