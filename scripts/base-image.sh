#!/bin/sh
# Makes the local base image from Debian's packages (no registry pull needed); skips it if present.
set -eu
IMAGE="${1:-localhost/debian:bookworm-slim}"
CONTAINERS_CONF="${CONTAINERS_CONF:-$(dirname "$0")/containers.conf}"
export CONTAINERS_CONF
if podman image exists "$IMAGE"; then
  echo "$IMAGE exists"
  exit 0
fi
tarball="$(mktemp --suffix=.tar)"
trap 'rm -f "$tarball"' EXIT
# Documentation, manuals and translations are excluded by dpkg, here and in every later install.
mmdebstrap --variant=minbase \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  bookworm "$tarball"
podman import "$tarball" "$IMAGE"
