"""Run pages: an agent's recent runs, a run with its steps (request and response sent to/from the LLM, the
step's messages) and thumbs up/down feedback on a step."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils.html import escape

from apps.agents.models import Step
from apps.agents.services import BlockSpec, MessageIn, agent_create, agent_send_message, run_create
from apps.core.actor import Role
from tests.factories import AgentFactory
from tests.support.scripted_llm import text, tool_call, tool_calls

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_in(client, user):
    client.force_login(user)
    return client


@pytest.fixture
def finished(actor, llm):
    """A two-step run: a memory tool call, then an answer."""
    agent = agent_create(
        actor=actor,
        name="Scribe",
        model="openai/gpt-4o-mini",
        memory_blocks=[BlockSpec(label="human", value="", limit=2000)],
    )
    llm.push(
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "Likes jazz"})),
        text("Noted: you like jazz."),
    )
    result = agent_send_message(
        actor=actor, agent_id=agent.id, messages=[MessageIn(content="Remember that I like jazz")]
    )
    return result.run


def test_the_run_page_shows_status_usage_and_each_step_with_its_llm_request_and_response(client_in, finished):
    steps = list(Step.all_objects.filter(run=finished).order_by("created_at"))

    page = client_in.get(reverse("ade:run-detail", args=[finished.id])).content.decode()

    assert 'data-testid="run-status">completed' in page
    assert "Turn ended" in page
    assert f"{sum(s.total_tokens for s in steps)} " in page
    assert page.count('data-testid="step"') == 2
    assert "Step 1" in page
    assert "Step 2" in page
    assert "gpt-4o-mini" in page
    assert f"{steps[0].latency_ms} ms" in page
    assert "Request sent to the LLM" in page
    assert escape('"content": "Remember that I like jazz"') in page  # the exact request, as JSON
    assert "Response from the LLM" in page
    assert "Noted: you like jazz." in page  # the step's messages
    assert "memory_insert" in page
    assert "Remember that I like jazz" in page  # the run's input


def test_the_step_request_and_response_are_the_stored_json(client_in, finished):
    step = Step.all_objects.filter(run=finished).order_by("created_at").first()

    page = client_in.get(reverse("ade:run-detail", args=[finished.id])).content.decode()

    assert step.request_json is not None
    assert step.response_json is not None
    assert escape(f'"model": "{step.request_json["model"]}"') in page


def test_thumbs_up_then_again_clears_it_and_thumbs_down_replaces_it(client_in, finished):
    step = Step.all_objects.filter(run=finished).first()
    url = reverse("ade:step-feedback", args=[step.id])

    up = client_in.post(url, {"feedback": "positive"}, HTTP_HX_REQUEST="true")
    step.refresh_from_db()
    assert step.feedback == "positive"
    assert 'class="thumb on"' in up.content.decode()

    client_in.post(url, {"feedback": "positive"}, HTTP_HX_REQUEST="true")
    step.refresh_from_db()
    assert step.feedback == ""

    down = client_in.post(url, {"feedback": "negative"}, HTTP_HX_REQUEST="true")
    step.refresh_from_db()
    assert step.feedback == "negative"
    assert down.content.decode().count('aria-pressed="true"') == 1


def test_unknown_feedback_is_refused(client_in, finished):
    step = Step.all_objects.filter(run=finished).first()

    response = client_in.post(
        reverse("ade:step-feedback", args=[step.id]), {"feedback": "meh"}, HTTP_HX_REQUEST="true"
    )

    assert response.status_code == 422
    step.refresh_from_db()
    assert step.feedback == ""


def test_the_agents_runs_list_links_each_run_newest_first(client_in, finished, actor):
    queued = run_create(actor=actor, agent_id=finished.agent_id, messages=[MessageIn(content="later")])

    page = client_in.get(reverse("ade:agent-runs", args=[finished.agent_id])).content.decode()

    newer = page.index(reverse("ade:run-detail", args=[queued.id]))
    older = page.index(reverse("ade:run-detail", args=[finished.id]))
    assert newer < older
    assert "created" in page
    assert "Turn ended" in page


def test_a_run_without_steps_says_so(client_in, actor, finished):
    queued = run_create(actor=actor, agent_id=finished.agent_id, messages=[MessageIn(content="later")])

    page = client_in.get(reverse("ade:run-detail", args=[queued.id])).content.decode()

    assert "This run has not finished a step yet." in page
    assert "later" in page


def test_another_organisations_runs_and_steps_are_not_found(client_in, other_org, other_org_actor, llm):
    theirs = AgentFactory(organization=other_org)
    their_run = run_create(actor=other_org_actor, agent_id=theirs.id, messages=[MessageIn(content="x")])
    their_step = Step.all_objects.create(organization=other_org, agent=theirs, run=their_run)

    assert client_in.get(reverse("ade:run-detail", args=[their_run.id])).status_code == 404
    assert client_in.get(reverse("ade:agent-runs", args=[theirs.id])).status_code == 404
    response = client_in.post(reverse("ade:step-feedback", args=[their_step.id]), {"feedback": "positive"})
    assert response.status_code == 404
    their_step.refresh_from_db()
    assert their_step.feedback == ""


def test_a_member_sees_runs_and_gives_feedback(client, org, make_user, finished):
    member = make_user(org, role=Role.MEMBER)
    client.force_login(member)
    step = Step.all_objects.filter(run=finished).first()

    assert client.get(reverse("ade:run-detail", args=[finished.id])).status_code == 200
    response = client.post(reverse("ade:step-feedback", args=[step.id]), {"feedback": "negative"})

    assert response.status_code == 200
    step.refresh_from_db()
    assert step.feedback == "negative"
