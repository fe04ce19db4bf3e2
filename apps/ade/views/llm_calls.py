"""ADE: a run's LLM call records (apps.llm.records), loaded into the run page by its _llm_calls.html
include: each call's model, status, tokens, latency, cost and error, the request as sent and the response,
and the request as a curl command (a placeholder where the key goes: no key is ever stored). And a step's
feedback note (_feedback_note.html, next to the thumbs), for datasets."""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.http import HttpResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from apps.ade.views.base import AdeRequest, ade_view, error_response, refusal_status
from apps.agents.models import FEEDBACK_NOTE_MAX_CHARS
from apps.agents.selectors import run_get, step_get
from apps.agents.services import step_set_feedback
from apps.core.errors import DomainError
from apps.llm.models import LlmCall
from apps.llm.selectors import llm_call_list
from apps.llm.services import llm_call_curl

RUN_PAGE_CALLS = 200


@dataclass
class CallView:
    call: LlmCall
    number: int
    request_pretty: str
    response_pretty: str
    curl: str


def _pretty(text: str, truncated: bool) -> str:
    if not text or truncated:
        return text
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


@require_GET
@ade_view
def run_llm_calls(request: AdeRequest, run_id: str) -> HttpResponse:
    run = run_get(actor=request.actor, run_id=run_id)
    calls = list(llm_call_list(actor=request.actor, run_id=run.id)[:RUN_PAGE_CALLS])
    views = [
        CallView(
            call=call,
            number=number,
            request_pretty=_pretty(call.request_body, call.truncated),
            response_pretty=_pretty(call.response_body, call.truncated),
            curl=llm_call_curl(call),
        )
        for number, call in enumerate(calls, start=1)
    ]
    return render(request, "ade/runs/llm_calls.html", {"run": run, "calls": views})


@require_POST
@ade_view
def step_feedback_note(request: AdeRequest, step_id: str) -> HttpResponse:
    """Save (an empty one clears) the note that goes with a step's thumbs up/down."""
    step = step_get(actor=request.actor, step_id=step_id)
    note = request.POST.get("note", "")
    if len(note) > FEEDBACK_NOTE_MAX_CHARS:
        return error_response(request, f"A note is at most {FEEDBACK_NOTE_MAX_CHARS} characters.", status=422)
    try:
        step = step_set_feedback(actor=request.actor, step_id=step.id, note=note.strip())
    except DomainError as exc:
        return error_response(request, exc, status=refusal_status(exc))
    return render(request, "ade/runs/_feedback_note.html", {"step": step, "saved": True})


urlpatterns = [
    path("runs/<str:run_id>/llm-calls/", run_llm_calls, name="run-llm-calls"),
    path("steps/<str:step_id>/feedback-note/", step_feedback_note, name="step-feedback-note"),
]
