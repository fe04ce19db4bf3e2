"""Celery entry points of the llm app."""

from __future__ import annotations

from celery import shared_task

from apps.llm.records import prune


@shared_task(name="llm.prune_llm_calls", acks_late=True, time_limit=600)
def prune_llm_calls_task() -> int:
    """Beat (CELERY_BEAT_SCHEDULE): LLM call records past their organisation's retention are deleted."""
    return prune()
