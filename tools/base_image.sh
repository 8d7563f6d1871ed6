#!/usr/bin/env bash
# A local stand-in for `python:3.11-slim`, for machines that reach Debian's package mirror but no image
# registry: debootstrap a minimal Debian bookworm (its python3 is 3.11), add a venv at /opt/venv whose
# `python` and `pip` come first on PATH (as in the official image), and `docker import` it.
#
#   tools/base_image.sh [TAG]        # default dynsched-base:bookworm; does nothing if TAG already exists
#
# Needs root, docker, debootstrap. The mirror is the one apt already uses here (DEBIAN_MIRROR overrides).
set -euo pipefail

TAG=${1:-dynsched-base:bookworm}
if docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "base image $TAG: cached"
    exit 0
fi

mirror=${DEBIAN_MIRROR:-}
if [[ -z $mirror ]]; then  # the first http(s) URI of apt's own sources (one-line or deb822 format)
    mirror=$(grep -rhoE '(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list \
             /etc/apt/sources.list.d/ 2>/dev/null | grep -oE 'https?://[^ ]+' | head -1 || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}

rootfs=$(mktemp -d /tmp/dynsched-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "base image $TAG: debootstrap bookworm from $mirror (a few minutes) ..."
debootstrap --variant=minbase --include=python3,python3-venv,redis-server,redis-tools,ca-certificates \
    bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || { tail -20 "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"
# This machine's own extra CA certificates (an HTTPS proxy's, where there is one) and package index, so
# pip inside the image build reaches PyPI the way pip on this machine does.
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
fi
index_url=$(python3 -m pip config get global.index-url 2>/dev/null || true)
pip_env=(--change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt'
         --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt')
[[ $index_url == http* ]] && pip_env+=(--change "ENV PIP_INDEX_URL=$index_url")
chroot "$rootfs" python3 -m venv /opt/venv
chroot "$rootfs" /opt/venv/bin/python -m pip --version >/dev/null
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' "${pip_env[@]}" --change 'CMD ["python3"]' - "$TAG" >/dev/null
echo "base image $TAG: built"
