"""Sandbox images: the base image (present locally, or pulled once), and derived images that hold a
sandbox config's pip requirements, built ONCE and tagged by a hash of what went into them.

No tool call ever runs pip: the first call with a new set of requirements builds
`letta-sandbox-deps:<hash>` (network needed then, unless a local wheelhouse serves every package),
and every later call, in any process, finds the tag and uses it.
"""

from __future__ import annotations

import hashlib
import io
import logging
import tarfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from docker.errors import APIError, BuildError, DockerException, ImageNotFound
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from apps.sandbox.docker_sandbox import LABEL, get_client

logger = logging.getLogger(__name__)

DERIVED_REPOSITORY = "letta-sandbox-deps"
BUILD_HINT = (
    "An operator can build the default one without a registry with scripts/build_sandbox_image.sh "
    "(`make run` does it before serving)."
)
UNAVAILABLE_RETRY_SECONDS = 60.0  # a missing base image or a failed build is not retried on every call


class ImageUnavailable(Exception):
    """The base image is neither present nor pullable (e.g. no registry reachable)."""


class ImageBuildFailed(Exception):
    """Installing the requirements failed; the message ends with the build log's last lines."""


class BadRequirement(ValueError):
    """A pip requirement that is not a PEP 508 requirement (options such as --index-url included)."""


@dataclass(frozen=True)
class ImagePlan:
    """What to run a tool on: the base image, and the derived tag when there are requirements."""

    base: str
    requirements: tuple[str, ...]
    tag: str | None  # None: run on the base image itself


_known: dict[str, str] = {}  # image name -> image id, found present in this process
_failed: dict[str, tuple[str, float]] = {}  # image name -> (why, when)
_build_locks: dict[str, threading.Lock] = {}
_wheel_digests: dict[tuple[tuple[str, int, int], ...], bytes] = {}
_lock = threading.Lock()
build_count = 0  # derived images this process built (tests assert the cache works)


def normalize_requirements(requirements: Iterable[object]) -> tuple[str, ...]:
    """Letta's `{"name", "version"}` items or PEP 508 strings -> validated, de-duplicated, sorted."""
    normalized: set[str] = set()
    for item in requirements:
        if isinstance(item, dict):
            name = str(item.get("name", "")).strip()
            version = str(item.get("version") or "").strip()
            text = f"{name}=={version}" if version and version[0].isdigit() else f"{name}{version}"
        else:
            text = str(item).strip()
        if not text:
            continue
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise BadRequirement(f"Invalid pip requirement {text!r}: {exc}") from exc
        if requirement.url:  # the build would fetch it from wherever it points, private addresses too
            raise BadRequirement(
                f"Invalid pip requirement {text!r}: direct references (URLs) are not allowed; packages come "
                "from the package index"
            )
        requirement.name = canonicalize_name(requirement.name)  # Foo_Bar and foo-bar: one image
        normalized.add(str(requirement))
    return tuple(sorted(normalized, key=str.lower))


def wheelhouse_files(wheelhouse: str | Path | None) -> list[Path]:
    if not wheelhouse:
        return []
    return sorted(Path(wheelhouse).glob("*.whl"))


def plan_image(
    *,
    base: str,
    base_id: str,
    requirements: Iterable[object],
    wheelhouse: str | Path | None = None,
    no_index: bool = False,
) -> ImagePlan:
    """Name the image for these requirements without touching the engine (cheap; a pure function).

    The hash covers the base image's id (see ensure_image), the sorted requirements, the wheelhouse's
    files, the index switch and the install options (wheels only): changing any of them (a re-pulled base included) yields a new tag, and
    an unchanged set reuses the old one.
    """
    reqs = normalize_requirements(requirements)
    if not reqs:
        return ImagePlan(base=base, requirements=(), tag=None)
    digest = hashlib.sha256()
    for part in (base_id or base, "\n".join(reqs), "no-index" if no_index else "index", "wheels-only"):
        digest.update(part.encode() + b"\0")
    digest.update(_wheelhouse_digest(wheelhouse))
    return ImagePlan(base=base, requirements=reqs, tag=f"{DERIVED_REPOSITORY}:{digest.hexdigest()[:20]}")


def _wheelhouse_digest(wheelhouse: str | Path | None) -> bytes:
    """Hash of the wheels' names and contents; re-read only when a file's size or mtime changes,
    since this runs on every tool call of a config with requirements."""
    stamp = tuple((w.name, w.stat().st_size, w.stat().st_mtime_ns) for w in wheelhouse_files(wheelhouse))
    with _lock:
        if stamp in _wheel_digests:
            return _wheel_digests[stamp]
    digest = hashlib.sha256()
    for wheel in wheelhouse_files(wheelhouse):
        digest.update(wheel.name.encode() + b"\0" + hashlib.sha256(wheel.read_bytes()).digest())
    with _lock:
        _wheel_digests[stamp] = digest.digest()
    return digest.digest()


def ensure_image(name: str, *, pull: bool) -> str:
    """The image id of `name`, pulling it once if allowed. Raises ImageUnavailable (cached a minute)."""
    with _lock:
        if name in _known:
            return _known[name]
        failed = _failed.get(name)
        if failed and time.monotonic() - failed[1] < UNAVAILABLE_RETRY_SECONDS:
            raise ImageUnavailable(failed[0])
    client = get_client()
    try:
        image_id = str(client.images.get(name).id)
    except ImageNotFound:
        if not pull:
            _fail(name, f"Sandbox image {name!r} is not present and pulling is disabled. {BUILD_HINT}")
        try:
            logger.info("sandbox.image_pull", extra={"image": name})
            image_id = str(client.images.pull(name).id)
        except (APIError, ImageNotFound) as exc:
            _fail(name, f"Sandbox image {name!r} is not present and could not be pulled: {exc}. {BUILD_HINT}")
    with _lock:
        _known[name] = image_id
        _failed.pop(name, None)
    return image_id


def image_available(name: str, *, pull: bool) -> bool:
    """ensure_image as a yes/no, for choosing a sandbox."""
    try:
        ensure_image(name, pull=pull)
    except (ImageUnavailable, DockerException):
        return False
    return True


def resolve_image(
    plan: ImagePlan, *, pull: bool, wheelhouse: str | Path | None = None, no_index: bool = False
) -> str:
    """The image a call runs on: the base, or the derived image (built now if it does not exist yet).

    Builds of one tag are serialised in this process; two processes may build the same tag at once,
    which wastes a build but yields the same image. Raises ImageUnavailable or ImageBuildFailed.
    """
    ensure_image(plan.base, pull=pull)
    if plan.tag is None:
        return plan.base
    tag = plan.tag
    with _lock:
        lock = _build_locks.setdefault(tag, threading.Lock())
    with lock:
        if _present(tag):
            return tag
        with _lock:
            failed = _failed.get(tag)
        if failed and time.monotonic() - failed[1] < UNAVAILABLE_RETRY_SECONDS:
            raise ImageBuildFailed(failed[0])
        _build(plan, wheelhouse=wheelhouse, no_index=no_index)
        with _lock:
            _failed.pop(tag, None)
        return tag


def _present(name: str) -> bool:
    """Is the image on the engine now? Asks the engine unless this process already saw it."""
    with _lock:
        if name in _known:
            return True
    try:
        image_id = str(get_client().images.get(name).id)
    except ImageNotFound:
        return False
    with _lock:
        _known[name] = image_id
    return True


def forget_images() -> None:
    """Drop this process's image caches (tests; after removing images by hand)."""
    with _lock:
        _known.clear()
        _failed.clear()


def dockerfile(plan: ImagePlan, *, has_wheels: bool, no_index: bool) -> str:
    """Root installs into the system site-packages; tools later run as nobody and only read them."""
    # Wheels only: installing a wheel unpacks files, while building an sdist runs its setup code, in a build
    # container that is not behind the egress filter.
    options = [
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--break-system-packages",
        "--only-binary=:all:",
    ]
    if has_wheels:
        options.append("--find-links=/wheelhouse")
    if no_index:
        options.append("--no-index")
    copy = "COPY wheelhouse /wheelhouse\n" if has_wheels else ""
    cleanup = " && rm -rf /wheelhouse" if has_wheels else ""
    return (
        f"FROM {plan.base}\n"
        "USER 0\n"
        f"{copy}COPY requirements.txt /tmp/requirements.txt\n"
        f"RUN python3 -m pip install {' '.join(options)} -r /tmp/requirements.txt"
        f" && rm -f /tmp/requirements.txt{cleanup}\n"
    )


def _build(plan: ImagePlan, *, wheelhouse: str | Path | None, no_index: bool) -> None:
    global build_count
    assert plan.tag is not None
    wheels = wheelhouse_files(wheelhouse)
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        _add(tar, "Dockerfile", dockerfile(plan, has_wheels=bool(wheels), no_index=no_index).encode())
        _add(tar, "requirements.txt", ("\n".join(plan.requirements) + "\n").encode())
        for wheel in wheels:
            tar.add(str(wheel), arcname=f"wheelhouse/{wheel.name}")
    context.seek(0)
    started = time.monotonic()
    logger.info("sandbox.image_build", extra={"tag": plan.tag, "requirements": list(plan.requirements)})
    try:
        get_client().images.build(
            fileobj=context,
            custom_context=True,
            tag=plan.tag,
            rm=True,
            forcerm=True,
            pull=False,
            labels={LABEL: "deps", "letta.sandbox.requirements": ",".join(plan.requirements)},
            network_mode="none" if no_index else None,
            timeout=900,
        )
    except BuildError as exc:
        tail = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in exc.build_log)
        message = f"Installing {', '.join(plan.requirements)} failed:\n{tail[-2000:]}"
        with _lock:
            _failed[plan.tag] = (message, time.monotonic())
        raise ImageBuildFailed(message) from exc
    build_count += 1
    logger.info(
        "sandbox.image_built", extra={"tag": plan.tag, "seconds": round(time.monotonic() - started, 1)}
    )


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _fail(name: str, why: str) -> None:
    with _lock:
        _failed[name] = (why, time.monotonic())
    raise ImageUnavailable(why)
