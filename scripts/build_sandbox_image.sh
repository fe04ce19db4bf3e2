#!/usr/bin/env bash
# Build the sandbox base image locally, without a container registry.
#
# Why: CI and development machines here run a Docker engine but can pull nothing, while Debian's
# package mirror is reachable. So: debootstrap a minimal Debian (minbase) with python3 and pip into
# a cache folder, pack it as a tarball, and `docker import` it. This is the platform's default
# SANDBOX_BASE_IMAGE; `make run` and `make test` call this script when it is missing. A deployment with
# a registry can set SANDBOX_BASE_IMAGE=python:3.12-slim instead.
#
# Idempotent and cached:
#   - the image already exists            -> nothing to do (milliseconds);
#   - the rootfs tarball is in the cache  -> re-import it (seconds, e.g. on a fresh Docker engine);
#   - otherwise                           -> debootstrap (minutes, needs Debian's mirror), then import.
#
# Usage: scripts/build_sandbox_image.sh [IMAGE]   (default letta-sandbox-base:py3)
# Environment: SANDBOX_IMAGE_CACHE (default ./var/sandbox-image), SANDBOX_DEBIAN_SUITE (bookworm),
#              SANDBOX_DEBIAN_MIRROR (http://deb.debian.org/debian).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${1:-letta-sandbox-base:py3}"
SUITE="${SANDBOX_DEBIAN_SUITE:-bookworm}"
MIRROR="${SANDBOX_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CACHE="${SANDBOX_IMAGE_CACHE:-$ROOT/var/sandbox-image}"
TARBALL="$CACHE/$SUITE-minbase-python3.tar.gz"
PACKAGES="python3,python3-pip,ca-certificates"

log() { echo "build_sandbox_image: $*" >&2; }

command -v docker >/dev/null || { log "no docker client on PATH"; exit 2; }
docker info >/dev/null 2>&1 || { log "no Docker engine answers"; exit 2; }

mkdir -p "$CACHE"
# One builder at a time (parallel test sessions share the cache and the engine).
exec 9>"$CACHE/.lock"
flock 9

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "$IMAGE already present"
    exit 0
fi

import_tarball() {
    log "importing $TARBALL as $IMAGE"
    docker import \
        --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PYTHONDONTWRITEBYTECODE=1' \
        --change 'WORKDIR /tmp' \
        --change 'CMD ["python3"]' \
        --message "letta sandbox base: debian $SUITE minbase + python3" \
        "$TARBALL" "$IMAGE" >/dev/null
    docker image inspect "$IMAGE" --format "build_sandbox_image: $IMAGE {{.Id}} {{.Size}} bytes" >&2
}

if [[ -s "$TARBALL" ]]; then
    import_tarball
    exit 0
fi

if ! command -v debootstrap >/dev/null; then
    [[ "$(id -u)" == 0 ]] || { log "debootstrap is missing and we are not root to install it"; exit 2; }
    log "installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

ROOTFS="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
trap 'rm -rf "$ROOTFS" "$TARBALL.tmp"' EXIT
log "debootstrap $SUITE (minbase + $PACKAGES) from $MIRROR"
# Progress: debootstrap's phases, and a count every 25 packages instead of a line for each.
if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" 2>&1 |
    tee "$CACHE/debootstrap.log" |
    awk '/^I: / {
        verb = $2
        if (verb == "Validating") next
        if (verb ~ /^(Retrieving|Extracting|Unpacking|Configuring)$/ && $3 !~ /^(required|the|base|Packages|InRelease|Release)/) {
            if (++count[verb] % 25 == 0) { print "build_sandbox_image: " verb " packages: " count[verb]; fflush() }
            next
        }
        print "build_sandbox_image: " substr($0, 4); fflush()
    }' >&2
then
    tail -n 30 "$CACHE/debootstrap.log" >&2
    exit 1
fi

# Trim what a tool never needs. Keep the stdlib's __pycache__: the root filesystem is read-only at run
# time, so without them every tool call would compile json, traceback... again (+50 ms a call).
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
    "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
    "$ROOTFS"/var/log/* "$ROOTFS"/tmp/*
find "$ROOTFS"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'C.*' -exec rm -rf {} +

tar --numeric-owner -C "$ROOTFS" -czf "$TARBALL.tmp" .
mv "$TARBALL.tmp" "$TARBALL"
log "rootfs tarball $(du -h "$TARBALL" | cut -f1) at $TARBALL"
import_tarball
