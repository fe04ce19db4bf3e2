"""The task bench/celery_hop.py sends: nothing but Celery's own work around it (`--include`d by its worker)."""

from celery import shared_task


@shared_task(name="bench.celery_noop", acks_late=True)
def noop(run_id: str, agent_id: str | None = None, conversation_id: str | None = None) -> None:
    return None
