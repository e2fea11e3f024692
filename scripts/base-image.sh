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
mmdebstrap --variant=minbase bookworm "$tarball"
podman import "$tarball" "$IMAGE"
