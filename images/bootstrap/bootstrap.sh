#!/usr/bin/env bash
# Make the Debian base image WITHOUT a container registry: debootstrap a minimal Debian rootfs from
# Debian's package mirror and `docker import` it.
#
#   images/bootstrap/bootstrap.sh [TAG]        (default TAG: adk-sandbox/debian:trixie)
#
# Environment: SUITE (default trixie), MIRROR (default http://deb.debian.org/debian),
# FORCE=1 to rebuild an image that already exists, WORKDIR (default /var/tmp) for the temporary rootfs.
#
# Idempotent: when TAG already exists nothing is done. Needs root (debootstrap does); installs debootstrap
# with apt when it is missing. About 25-60 s and ~210 MB. `adk-sandbox images build` calls this when no
# --base-image is given, the bootstrap image is missing and no registry answers.
set -euo pipefail

tag=${1:-adk-sandbox/debian:trixie}
suite=${SUITE:-trixie}
mirror=${MIRROR:-http://deb.debian.org/debian}

log() { printf '[bootstrap] %s\n' "$*" >&2; }
die() { printf '[bootstrap] ERROR: %s\n' "$*" >&2; exit 1; }

command -v docker >/dev/null 2>&1 || die "the docker CLI is not installed"
docker info >/dev/null 2>&1 || die "the Docker daemon does not answer (start it: scripts/setup, or dockerd)"

if [[ -z ${FORCE:-} ]] && docker image inspect "$tag" >/dev/null 2>&1; then
    log "$tag already exists; nothing to do (FORCE=1 rebuilds it)"
    exit 0
fi

[[ $(id -u) == 0 ]] || die "debootstrap needs root; run this as root, or build with --base-image IMAGE from a registry"

if ! command -v debootstrap >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "debootstrap is missing and apt-get is not available to install it"
    log "installing debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

rootfs=$(mktemp -d "${WORKDIR:-/var/tmp}/adk-rootfs.XXXXXX")
cleanup() { rm -rf --one-file-system "$rootfs"; }
trap cleanup EXIT

log "debootstrap --variant=minbase $suite from $mirror"
start=$SECONDS
debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >&2
log "debootstrap took $((SECONDS - start)) s"

# No host identity and no package caches in the image (Docker provides hostname/resolv.conf at runtime).
rm -rf "${rootfs:?}"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/*.log
: >"$rootfs/etc/hostname"
: >"$rootfs/etc/resolv.conf"

log "importing the rootfs as $tag"
tar --numeric-owner -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    - "$tag" >/dev/null
log "done: $tag ($(docker image inspect --format '{{.Id}}' "$tag"))"
