import os

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

app = Celery("letta_django")
app.config_from_object("django.conf:settings", namespace="CELERY")
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
