"""A worker told to stop (SIGTERM) finishes its runs within WORKER_SHUTDOWN_TIMEOUT, or hands them back.

Celery's warm shutdown stops taking tasks and waits for the running ones, however long they take (a run
may take RUN_DEADLINE, 15 minutes), while an orchestrator kills the process after its grace period (30 s in
Kubernetes, 10 s in Docker by default): a run killed so is failed by crash recovery, and its user has to
send the message again. Here a watchdog bounds the wait. Runs that end within the timeout end as usual;
those still executing then are handed back (apps.agents.recovery.hand_back_runs: `running` -> `created`,
their task sent again) and the process exits at once, pool processes and tool jails included. Its
conversation locks (session advisory locks) go with its database sessions, and another worker resumes
each run from its last stored step.

Why nothing is half-written: a step is stored in one statement (apps.agents.loop.store), so a run
stopped anywhere has whole steps only, and resuming loads the conversation as those steps left it. The
hand-back is the fence: from the moment the run is `created` again, the lease check of every loop write
(agents 0012) refuses this executor's writes, so nothing it does in its last milliseconds is stored. What
the interrupted step had done is lost and done again: its LLM call, and its tool calls (a tool's own
side effects, e.g. a memory edit, may so happen twice). Its events stay in the run's stream, followed by
the resumed attempt's. The hand-back happens while this process still holds the conversation's lock,
so no later run of the conversation can slip in before the resumed one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time

import psutil
from django.conf import settings
from django.db import connection

from apps.agents.recovery import hand_back_runs
from apps.core import fencing

logger = logging.getLogger(__name__)

EXECUTE_RUN_TASK = "agents.execute_run"
POLL_S = 0.2
_watchdogs: list[threading.Thread] = []


def executing_run_ids() -> list[str]:
    """The runs this worker is executing now: those whose task it holds (its pool's active requests:
    threads or processes, as the main process sees them) and, with the threads pool, every run its
    threads execute, the inline ones too (a wait-for-reply message's, a group speaker's: apps.core.fencing)."""
    from celery.worker import state

    queued = {
        str(request.args[0]) for request in list(state.active_requests) if request.name == EXECUTE_RUN_TASK
    }
    return sorted(queued | set(fencing.executing_run_ids()))


def start_watchdog(how: str) -> threading.Thread | None:
    """On a warm shutdown (celery's `worker_shutting_down`, in the main process): watch the runs in flight
    until they end or WORKER_SHUTDOWN_TIMEOUT has passed. A cold shutdown is Celery's own business."""
    if how != "Warm" or _watchdogs:  # one per shutdown: Ctrl-C also sends the group SIGINT, then SIGTERM
        return None
    deadline = time.monotonic() + float(settings.WORKER_SHUTDOWN_TIMEOUT)
    watchdog = threading.Thread(target=_watch, args=(deadline,), name="shutdown-watchdog", daemon=True)
    _watchdogs.append(watchdog)
    watchdog.start()
    return watchdog


def _watch(deadline: float) -> None:
    started = time.monotonic()
    while time.monotonic() < deadline:
        if not executing_run_ids():
            return  # all finished: Celery's own shutdown goes on and the process exits normally
        time.sleep(POLL_S)
    run_ids = executing_run_ids()
    if not run_ids:
        return
    try:
        handed = hand_back_runs(run_ids)
    finally:
        connection.close()
    logger.warning(
        "agents.shutdown_handed_back runs=%s waited=%.1fs",
        ",".join(handed) or "-",
        time.monotonic() - started,
        extra={"run_ids": handed},
    )
    exit_now()


def exit_now() -> None:
    """End this worker at once: its pool processes and tool jails first (killed, as they hold database
    sessions and locks of their own), then itself, without the interpreter's exit (which would wait for
    the pool's threads)."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()
    os._exit(0)
