#!/usr/bin/env bash
# Build the sandbox base image locally, without a container registry.
#
# Why: CI and development machines here run a Docker engine but can pull nothing, while Debian's
# package mirror is reachable. So: debootstrap a minimal Debian (minbase) with python3 and pip into
# a cache folder, add pydantic (custom tools take pydantic models as arguments, as in Letta; Debian's
# python3-pydantic is 1.x) at the versions requirements.txt pins for the platform itself, pack it as a
# tarball, and `docker import` it. This is the platform's default SANDBOX_BASE_IMAGE; `make run` and
# `make test` call this script when it is missing. A deployment with a registry can set
# SANDBOX_BASE_IMAGE=python:3.12-slim instead (without pydantic: a sandbox config's pip requirements add it).
#
# Idempotent and cached. The image carries the label letta.sandbox.recipe, a hash of what went into it
# (this script's revision, suite, Debian packages, pinned Python packages); an image of another recipe (an older script, a new
# pydantic pin) is rebuilt under the same tag:
#   - the image exists, same recipe       -> nothing to do (milliseconds);
#   - the recipe's tarball is cached      -> re-import it (seconds, e.g. on a fresh Docker engine);
#   - the debootstrapped rootfs is cached -> add the Python packages to it, then import (seconds; PyPI);
#   - otherwise                           -> debootstrap (minutes, needs Debian's mirror), then the above.
# The Python packages are fetched by the host's pip (the platform's virtualenv, so its index and
# certificates apply) as wheels for the image's Python, and compiled by the image's own interpreter.
#
# Usage: scripts/build_sandbox_image.sh [IMAGE]   (default letta-sandbox-base:py3)
# Environment: SANDBOX_IMAGE_CACHE (default ./var/sandbox-image), SANDBOX_DEBIAN_SUITE (bookworm),
#              SANDBOX_DEBIAN_MIRROR (http://deb.debian.org/debian), SANDBOX_IMAGE_PIP_PYTHON (the
#              interpreter whose pip fetches the Python packages; default .venv/bin/python, else python3).
set -euo pipefail
umask 022 # tools run as nobody: everything in the image must be world-readable

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${1:-letta-sandbox-base:py3}"
SUITE="${SANDBOX_DEBIAN_SUITE:-bookworm}"
MIRROR="${SANDBOX_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CACHE="${SANDBOX_IMAGE_CACHE:-$ROOT/var/sandbox-image}"
BASE_TARBALL="$CACHE/$SUITE-minbase-python3.tar.gz" # debootstrap's output, before the Python packages
PACKAGES="python3,python3-pip,ca-certificates"
# pydantic and what it requires; each at the version requirements.txt pins (a missing pin is an error).
PYTHON_PACKAGES="pydantic pydantic-core annotated-types typing-extensions typing-inspection"
RECIPE_LABEL="letta.sandbox.recipe"
RECIPE_REVISION=1 # raise it when this script builds the rootfs differently: every image is rebuilt then

log() { echo "build_sandbox_image: $*" >&2; }

pin_of() { # the version requirements.txt pins for a distribution (names compared normalised)
    awk -F'==' -v want="$1" '{
        name = tolower($1); gsub(/[-_.]+/, "-", name)
        if (name == want && NF > 1) { sub(/[ \t;#].*$/, "", $2); print $2; exit }
    }' "$ROOT/requirements.txt"
}

SPECS=""
for package in $PYTHON_PACKAGES; do
    version="$(pin_of "$package")"
    [[ -n "$version" ]] || { log "requirements.txt pins no version of $package"; exit 2; }
    SPECS="$SPECS $package==$version"
done
PYDANTIC_VERSION="$(pin_of pydantic)"
# shellcheck disable=SC2086 # one line per requirement
RECIPE="$(printf '%s\n' "$RECIPE_REVISION" "$SUITE" "$PACKAGES" $SPECS | sha256sum | cut -c1-16)"
TARBALL="$CACHE/$SUITE-minbase-python3-$RECIPE.tar.gz"

command -v docker >/dev/null || { log "no docker client on PATH"; exit 2; }
docker info >/dev/null 2>&1 || { log "no Docker engine answers"; exit 2; }

mkdir -p "$CACHE"
# One builder at a time (parallel test sessions share the cache and the engine).
exec 9>"$CACHE/.lock"
flock 9

OLD_ID=""
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    present="$(docker image inspect "$IMAGE" --format "{{ index .Config.Labels \"$RECIPE_LABEL\" }}")"
    if [[ "$present" == "$RECIPE" ]]; then
        log "$IMAGE already present"
        exit 0
    fi
    OLD_ID="$(docker image inspect "$IMAGE" --format '{{.Id}}')"
    log "$IMAGE was built from another recipe (${present:-none}, now $RECIPE: pydantic $PYDANTIC_VERSION): rebuilding it"
fi

import_tarball() {
    log "importing $TARBALL as $IMAGE"
    docker import \
        --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PYTHONDONTWRITEBYTECODE=1' \
        --change 'WORKDIR /tmp' \
        --change 'CMD ["python3"]' \
        --change "LABEL $RECIPE_LABEL=$RECIPE letta.sandbox.pydantic=$PYDANTIC_VERSION" \
        --message "letta sandbox base: debian $SUITE minbase + python3 + pydantic $PYDANTIC_VERSION" \
        "$TARBALL" "$IMAGE" >/dev/null
    docker image inspect "$IMAGE" --format "build_sandbox_image: $IMAGE {{.Id}} {{.Size}} bytes" >&2
    # The image this one replaces, unless containers or derived images still use it.
    if [[ -n "$OLD_ID" ]]; then docker image rm "$OLD_ID" >/dev/null 2>&1 || true; fi
}

if [[ -s "$TARBALL" ]]; then
    import_tarball
    exit 0
fi

in_rootfs() { env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 chroot "$ROOTFS" "$@"; }

add_python_packages() {
    [[ "$(id -u)" == 0 ]] || { log "adding the Python packages to the rootfs needs root (chroot)"; exit 2; }
    local pip_python="${SANDBOX_IMAGE_PIP_PYTHON:-}"
    if [[ -z "$pip_python" ]]; then
        pip_python="python3"
        [[ -x "$ROOT/.venv/bin/python" ]] && pip_python="$ROOT/.venv/bin/python"
    fi
    "$pip_python" -m pip --version >/dev/null 2>&1 ||
        { log "$pip_python has no pip to fetch$SPECS (set SANDBOX_IMAGE_PIP_PYTHON)"; exit 2; }
    local version glibc arch platforms=() minor
    version="$(in_rootfs /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    glibc="$(in_rootfs /usr/bin/python3 -c 'import os; print(os.confstr("CS_GNU_LIBC_VERSION").split()[1])')"
    arch="$(uname -m)"
    platforms+=(--platform "manylinux2014_$arch")
    for ((minor = 17; minor <= ${glibc#2.}; minor++)); do platforms+=(--platform "manylinux_2_${minor}_$arch"); done
    local site="/usr/local/lib/python$version/dist-packages"
    log "adding$SPECS for Python $version ($arch, glibc $glibc) with $pip_python's pip"
    # shellcheck disable=SC2086 # SPECS is a list of requirement words
    "$pip_python" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
        --no-deps --no-compile --only-binary=:all: --python-version "$version" --implementation cp \
        --abi "cp${version/./}" "${platforms[@]}" --target "$ROOTFS$site" $SPECS
    in_rootfs /usr/bin/python3 -m compileall -q "$site" >/dev/null
    local found
    found="$(in_rootfs /usr/bin/python3 -I -c 'import pydantic; from pydantic import TypeAdapter; print(pydantic.VERSION)')"
    [[ "$found" == "$PYDANTIC_VERSION" ]] || { log "the image imports pydantic $found, not $PYDANTIC_VERSION"; exit 1; }
}

ROOTFS="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
trap 'rm -rf "$ROOTFS" "$TARBALL.tmp" "$BASE_TARBALL.tmp"' EXIT

pack() { # pack the rootfs as $1
    chmod 755 "$ROOTFS" # the image's / (mktemp made it 0700)
    tar --numeric-owner -C "$ROOTFS" -czf "$1.tmp" .
    mv "$1.tmp" "$1"
    log "rootfs tarball $(du -h "$1" | cut -f1) at $1"
}

if [[ -s "$BASE_TARBALL" ]]; then
    log "unpacking the cached rootfs $BASE_TARBALL"
    tar --numeric-owner -C "$ROOTFS" -xzpf "$BASE_TARBALL"
    add_python_packages
    pack "$TARBALL"
    find "$CACHE" -maxdepth 1 -name "$SUITE-minbase-python3-*.tar.gz" ! -path "$TARBALL" -delete
    import_tarball
    exit 0
fi

if ! command -v debootstrap >/dev/null; then
    [[ "$(id -u)" == 0 ]] || { log "debootstrap is missing and we are not root to install it"; exit 2; }
    log "installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

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

pack "$BASE_TARBALL"
add_python_packages
pack "$TARBALL"
find "$CACHE" -maxdepth 1 -name "$SUITE-minbase-python3-*.tar.gz" ! -path "$TARBALL" -delete
import_tarball
