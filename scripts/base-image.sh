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
# usrmerge (and the perl it pulls in, ~47 MB) is only needed while /usr is merged: removed after.
mmdebstrap --variant=minbase \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='chroot "$1" apt-get purge -y --auto-remove usrmerge perl libperl5.36 perl-modules-5.36 libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl libgdbm-compat4' \
  bookworm "$tarball"
podman import "$tarball" "$IMAGE"
