"""ADE: runs and their steps. An agent's recent runs, and a run page: status, stop reason, duration, usage,
and each step (one LLM call) with its model, tokens, latency, the exact request sent to the LLM and its
response, the messages it produced, and a person's thumbs up/down (HTMX)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.http import HttpResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from apps.ade.forms.runs import StepFeedbackForm
from apps.ade.views.base import AdeRequest, ade_view, error_response, refusal_status
from apps.ade.views.conversation import STOP_REASON_LABELS, STOP_REASON_TONES, pretty_json, timeline_events
from apps.agents.models import Message, Run, Step
from apps.agents.selectors import (
    agent_get,
    run_get,
    run_list,
    run_list_with_usage,
    run_message_list,
    step_get,
    step_list,
)
from apps.agents.services import step_set_feedback
from apps.core.errors import DomainError
from apps.observability.selectors import run_waterfall

RECENT_RUNS = 50
STATUS_TONES = {"completed": "ok", "failed": "err", "cancelled": "warn", "running": "", "created": ""}


@dataclass
class StepView:
    step: Step
    number: int
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def request_pretty(self) -> str:
        return pretty_json(self.step.request_json) if self.step.request_json is not None else ""

    @property
    def response_pretty(self) -> str:
        return pretty_json(self.step.response_json) if self.step.response_json is not None else ""


def _run_row(run: Run) -> dict[str, Any]:
    return {
        "run": run,
        "status_tone": STATUS_TONES.get(run.status, ""),
        "stop_tone": STOP_REASON_TONES.get(run.stop_reason, "err"),
        "stop_label": STOP_REASON_LABELS.get(run.stop_reason, run.stop_reason),
        "duration_s": run.total_duration_ns / 1e9 if run.total_duration_ns else None,
    }


@require_GET
@ade_view
def run_detail(request: AdeRequest, run_id: str) -> HttpResponse:
    actor = request.actor
    run = run_get(actor=actor, run_id=run_id)
    run = run_list_with_usage(actor=actor, run_ids=[run.id])[run.id]
    agent = agent_get(actor=actor, agent_id=run.agent_id)
    messages = list(run_message_list(actor=actor, run_id=run.id, include_system=True).order_by("sequence_id"))
    by_step: dict[str | None, list[Message]] = {}
    for message in messages:
        by_step.setdefault(message.step_id, []).append(message)
    steps = [
        StepView(step=step, number=i, events=timeline_events(by_step.get(step.id, [])))
        for i, step in enumerate(step_list(actor=actor, run_id=run.id).order_by("created_at"), start=1)
    ]
    context = {
        "agent": agent,
        "row": _run_row(run),
        "run": run,
        "input_events": timeline_events(by_step.get(None, [])),
        "steps": steps,
        "error": (run.error or {}).get("message") if isinstance(run.error, dict) else run.error,
        "request_config": pretty_json(run.request_config or {}),
        "waterfall": run_waterfall(actor=actor, run_id=run.id),
    }
    return render(request, "ade/runs/detail.html", context)


@require_GET
@ade_view
def agent_runs(request: AdeRequest, agent_id: str) -> HttpResponse:
    actor = request.actor
    agent = agent_get(actor=actor, agent_id=agent_id)
    recent = list(
        run_list(actor=actor, agent_id=agent.id)
        .order_by("-created_at")
        .values_list("id", flat=True)[:RECENT_RUNS]
    )
    by_id = run_list_with_usage(actor=actor, run_ids=recent)
    rows = [_run_row(by_id[run_id]) for run_id in recent if run_id in by_id]
    return render(request, "ade/runs/list.html", {"agent": agent, "rows": rows})


@require_POST
@ade_view
def step_feedback(request: AdeRequest, step_id: str) -> HttpResponse:
    """Thumbs up/down on a step; choosing the current value again clears it."""
    step = step_get(actor=request.actor, step_id=step_id)
    form = StepFeedbackForm(request.POST)
    if not form.is_valid():
        return error_response(request, form.first_error, status=422)
    wanted = form.cleaned_data["feedback"]
    try:
        step = step_set_feedback(
            actor=request.actor, step_id=step.id, feedback=None if step.feedback == wanted else wanted
        )
    except DomainError as exc:
        return error_response(request, exc, status=refusal_status(exc))
    return render(request, "ade/runs/_feedback.html", {"step": step})


urlpatterns = [
    path("runs/<str:run_id>/", run_detail, name="run-detail"),
    path("agents/<str:agent_id>/runs/", agent_runs, name="agent-runs"),
    path("steps/<str:step_id>/feedback/", step_feedback, name="step-feedback"),
]
