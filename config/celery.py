import os
from collections.abc import Iterator, Mapping
from typing import Any

from celery import Celery
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_ready,
    worker_shutting_down,
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


class DjangoCelerySettings(Mapping[str, Any]):
    """Django's CELERY_* settings as a plain mapping, read once when Celery first needs its configuration.

    Celery reads its configuration at every publish and every task (~10 keys each, several spellings of a
    key tried in turn); from `django.conf:settings` each miss is an AttributeError raised through Django's
    LazySettings, ~18 us a key on these machines against ~7 from a mapping (bench/RESULTS.md, 2026-12-07).
    Settings are fixed once Django has started, so the snapshot is the same configuration."""

    def __init__(self) -> None:
        self._values: dict[str, Any] | None = None

    def _read(self) -> dict[str, Any]:
        if self._values is None:
            from django.conf import settings

            self._values = {
                name: getattr(settings, name) for name in dir(settings) if name.startswith("CELERY_")
            }
        return self._values

    def __getitem__(self, key: str) -> Any:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


app = Celery("letta_django")
app.config_from_object(DjangoCelerySettings(), namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _preload_litellm(**_: object) -> None:
    """Workers call providers on every step: import litellm (imported lazily elsewhere, see
    apps/llm/_litellm.py) before the pool forks, so every child shares it instead of importing its own."""
    from apps.llm._litellm import load

    load()


@worker_init.connect
@worker_process_init.connect
def _set_up_tracing(**_: object) -> None:
    """Tracing (apps/observability/tracing.py) in the worker and in each prefork child: with OTLP on, the
    Celery instrumentation continues the sending request's trace from the task's headers."""
    from apps.observability.tracing import configure

    configure("letta-worker")


@worker_ready.connect
@worker_process_init.connect
def freeze_start_up_objects(**_: object) -> None:
    """Once started (Django, litellm, the instrumentations: ~560,000 objects that live as long as the
    worker; after tracing's set-up above), move what start-up made out of the garbage collector's walks
    (gc.freeze; garbage collected first, so none is kept). Each full collection walked all of them, ~0.5
    s with every thread of the worker stopped, every few hundred turns; it now walks what runs made.
    worker_ready: the threads pool's process; worker_process_init: each prefork child."""
    import gc

    gc.collect()
    gc.freeze()


@task_prerun.connect
@task_postrun.connect
def _close_old_connections(**_: object) -> None:
    """Between tasks, as between requests: drop this thread's connection if it broke or outlived
    CONN_MAX_AGE (CELERY_DB_REUSE_MAX keeps Celery from closing it after every task)."""
    from django.db import close_old_connections

    close_old_connections()


@worker_shutting_down.connect
def _bound_the_shutdown(how: str = "", **_: object) -> None:
    """SIGTERM (a warm shutdown): runs still going after WORKER_SHUTDOWN_TIMEOUT are handed back to the
    queue and the worker exits (apps/agents/worker_shutdown.py), instead of waiting for them unbounded."""
    from apps.agents.worker_shutdown import start_watchdog

    start_watchdog(how)
