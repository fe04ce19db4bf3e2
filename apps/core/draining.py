"""Whether this process is shutting down: set by the web server when it starts draining (config/serve.py),
read by the readiness check (/v1/ready answers 503 from then on)."""

from __future__ import annotations

import threading

_draining = threading.Event()


def begin() -> None:
    """From now on this process is shutting down (there is no way back: a drained process exits)."""
    _draining.set()


def is_draining() -> bool:
    return _draining.is_set()
