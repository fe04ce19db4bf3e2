"""POST /v1/agents/{agent_id}/recompile, /summarize and /generate (issue 18), through DRF's APIClient.

Summarize and generate call the scripted LLM from the request itself, as Letta's do.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.agents.models import Agent, Message, Run, Step
from apps.agents.system_messages import THREAD_SYSTEM_MESSAGE
from apps.core.actor import Actor, Role
from apps.core.permissions import Action, allows
from apps.memory.models import Block
from tests.api.test_conversations_api import seed
from tests.api.test_messages_api import new_agent
from tests.factories import MessageFactory
from tests.support.scripted_llm import error, text, tool_call, tool_calls

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(actor: Actor, api_client_for: Any) -> APIClient:
    return api_client_for(actor)


def stored_counts(actor: Actor) -> tuple[int, int, int]:
    """Messages (besides threads' stored system messages), runs and steps."""
    return (
        Message.objects.for_actor(actor).exclude(THREAD_SYSTEM_MESSAGE).count(),
        Run.objects.for_actor(actor).count(),
        Step.objects.for_actor(actor).count(),
    )


# --- recompile --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/v1/agents/{agent}/recompile", "/v1/agents/{agent}/system-prompt/recompile"]
)
def test_recompile_answers_the_system_prompt_with_current_memory_and_stores_it_unless_dry_run(
    client, actor, llm, path
):
    agent = new_agent(actor, system="You are Ada's assistant.")
    Block.objects.for_actor(actor).filter(label="human").update(value="Name: Ada")
    before = Agent.objects.for_actor(actor).values("message_ids", "updated_at").get()

    dry = client.post(path.format(agent=agent.id) + "?dry_run=true&update_timestamp=true")
    after_dry_run = Message.objects.for_actor(actor).get(THREAD_SYSTEM_MESSAGE).text
    saved = client.post(path.format(agent=agent.id))

    assert dry.status_code == saved.status_code == 200
    assert dry["Content-Type"] == "application/json"
    assert dry.json().startswith("You are Ada's assistant.")
    assert "Name: Ada" in dry.json()
    assert saved.json() == dry.json()
    assert Agent.objects.for_actor(actor).values("message_ids", "updated_at").get() == before
    assert stored_counts(actor) == (0, 0, 0)
    assert "Name: Ada" not in after_dry_run  # compiled when the agent was created
    assert Message.objects.for_actor(actor).get(THREAD_SYSTEM_MESSAGE).text == saved.json()


def test_recompile_of_another_organisations_agent_is_a_404(api_client_for, actor, other_org_actor, llm):
    agent = new_agent(actor)

    response = api_client_for(other_org_actor).post(f"/v1/agents/{agent.id}/recompile")

    assert response.status_code == 404


# --- summarize (agents.messages.compact) --------------------------------------------------------------------


def test_summarize_compacts_the_default_thread(client, actor, llm):
    agent = new_agent(actor)
    seed(actor, agent, None, "My name is Sam", "Hi Sam", "I like tea", "Noted")
    llm.push(text("Sam likes tea."))

    response = client.post(f"/v1/agents/{agent.id}/summarize", {}, format="json")

    assert response.status_code == 200, response.content
    assert response.json() == {"summary": "Sam likes tea.", "num_messages_before": 4, "num_messages_after": 2}
    ids = Agent.objects.for_actor(actor).get().message_ids
    assert Message.objects.for_actor(actor).get(id=ids[0]).role == "summary"
    assert Message.objects.for_actor(actor).get(id=ids[1]).text == "Noted"
    assert "user: My name is Sam" in llm.last_chat_request()["messages"][1]["content"]


def test_summarize_with_a_custom_prompt_in_all_mode(client, actor, llm):
    agent = new_agent(actor)
    seed(actor, agent, None, "hi", "hello")
    llm.push(text("Greetings."))

    response = client.post(
        f"/v1/agents/{agent.id}/summarize",
        {"compaction_settings": {"mode": "all", "prompt": "Summarise in one word."}},
        format="json",
    )

    assert response.json()["num_messages_after"] == 1
    assert llm.last_chat_request()["messages"][0] == {"role": "system", "content": "Summarise in one word."}


def test_summarize_with_nothing_but_a_summary_returns_it_and_calls_no_model(client, actor, llm):
    agent = new_agent(actor)
    summary = MessageFactory(
        organization_id=actor.organization_id,
        agent=agent,
        role="summary",
        text="[Automated system message] 4 earlier messages were removed.\nSummary of what was removed:\nTea.",
    )
    Agent.objects.for_actor(actor).filter(id=agent.id).update(message_ids=[summary.id])

    response = client.post(f"/v1/agents/{agent.id}/summarize")

    assert response.json() == {"summary": "Tea.", "num_messages_before": 1, "num_messages_after": 1}
    assert llm.chat_requests() == []


def test_summarize_that_cannot_reduce_is_a_400(client, actor, llm):
    agent = new_agent(actor)
    seed(actor, agent, None, "hi", "hello")

    response = client.post(f"/v1/agents/{agent.id}/summarize", {}, format="json")

    assert response.status_code == 400
    assert response.json()["detail"].startswith("Summarization failed to reduce the number of messages.")
    assert llm.chat_requests() == []


def test_summarize_rejects_an_unknown_mode(client, actor, llm):
    agent = new_agent(actor)
    seed(actor, agent, None, "a", "b", "c", "d")

    response = client.post(
        f"/v1/agents/{agent.id}/summarize", {"compaction_settings": {"mode": "everything"}}, format="json"
    )

    assert response.status_code == 422
    assert len(Agent.objects.for_actor(actor).get().message_ids) == 4


ROLES = ("owner", "admin", "creator", "member")


@pytest.mark.parametrize("role", ROLES)
def test_summarize_is_for_who_may_configure_the_agent(role, org, make_user, api_client_for, llm):
    people = {}
    for name, kind in (
        ("owner", Role.OWNER),
        ("admin", Role.ADMIN),
        ("creator", Role.MEMBER),
        ("member", Role.MEMBER),
    ):
        person = make_user(org, role=kind, username=name)
        people[name] = Actor(organization_id=org.id, user_id=person.id, role=kind)
    agent = new_agent(people["creator"])
    seed(people["creator"], agent, None, "hi", "hello")
    llm.push(text("Greetings."))
    actor = people[role]

    response = api_client_for(actor).post(
        f"/v1/agents/{agent.id}/summarize", {"compaction_settings": {"mode": "all"}}, format="json"
    )

    if allows(actor, Action.AGENT_CONFIGURE, creator_id=agent.created_by_id):
        assert response.status_code == 200, response.content
        assert len(Agent.objects.unscoped().get(id=agent.id).message_ids) == 1
    else:
        assert response.status_code == 403
        assert response.json()["detail"].startswith("Not allowed")
        assert len(Agent.objects.unscoped().get(id=agent.id).message_ids) == 2
        assert llm.chat_requests() == []


# --- generate ---------------------------------------------------------------------------------------------


def test_generate_answers_with_the_agents_model_and_stores_nothing(client, actor, llm):
    agent = new_agent(actor)
    seed(actor, agent, None, "an old message")
    before = stored_counts(actor)
    llm.push(text("Paris.", usage={"prompt_tokens": 12, "completion_tokens": 2}))

    response = client.post(
        f"/v1/agents/{agent.id}/generate",
        {"prompt": "Capital of France?", "system_prompt": "Answer in one word."},
        format="json",
    )

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["content"], body["model"]) == ("Paris.", "gpt-4o-mini")
    assert body["usage"]["message_type"] == "usage_statistics"
    assert (
        body["usage"]["prompt_tokens"],
        body["usage"]["completion_tokens"],
        body["usage"]["total_tokens"],
    ) == (
        12,
        2,
        14,
    )
    sent = llm.last_chat_request()
    assert sent["model"] == "gpt-4o-mini"
    assert sent["messages"] == [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of France?"},
    ]
    assert "tools" not in sent
    assert stored_counts(actor) == before


def test_generate_without_a_system_prompt_uses_a_minimal_one_and_honours_override_model(client, actor, llm):
    agent = new_agent(actor)
    llm.push(text("Hi"))

    response = client.post(
        f"/v1/agents/{agent.id}/generate",
        {"prompt": "hello", "override_model": "openai/gpt-4.1"},
        format="json",
    )

    assert response.json()["model"] == "gpt-4.1"
    sent = llm.last_chat_request()
    assert sent["model"] == "gpt-4.1"
    assert sent["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}


def test_generate_with_a_response_schema_answers_the_forced_tool_calls_arguments(client, actor, llm):
    agent = new_agent(actor)
    llm.push(tool_calls(tool_call("structured_output", {"city": "Paris"})))
    schema = {"properties": {"city": {"type": "string"}}}

    response = client.post(
        f"/v1/agents/{agent.id}/generate",
        {"prompt": "Capital of France?", "response_schema": schema},
        format="json",
    )

    assert json.loads(response.json()["content"]) == {"city": "Paris"}
    sent = llm.last_chat_request()
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "structured_output"}}
    assert sent["tools"][0]["function"]["parameters"] == {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t"])
def test_a_blank_prompt_is_a_422_and_calls_no_model(client, actor, llm, prompt):
    agent = new_agent(actor)

    response = client.post(f"/v1/agents/{agent.id}/generate", {"prompt": prompt}, format="json")

    assert response.status_code == 422
    assert "prompt" in response.json()["detail"]
    assert llm.chat_requests() == []
    assert stored_counts(actor) == (0, 0, 0)


def test_a_missing_prompt_is_a_422(client, actor, llm):
    agent = new_agent(actor)

    response = client.post(f"/v1/agents/{agent.id}/generate", {"system_prompt": "x"}, format="json")

    assert response.status_code == 422
    assert llm.chat_requests() == []


def test_an_unknown_override_model_is_a_404(client, actor, llm):
    agent = new_agent(actor)

    response = client.post(
        f"/v1/agents/{agent.id}/generate",
        {"prompt": "hi", "override_model": "nowhere/model-x"},
        format="json",
    )

    assert response.status_code == 404
    assert response.json()["detail"] == "Model 'nowhere/model-x' not found or not accessible"
    assert llm.chat_requests() == []


def test_a_failing_provider_is_a_502_after_the_retries(client, actor, llm):
    agent = new_agent(actor)
    llm.push(error(500, "down", times=3))

    response = client.post(f"/v1/agents/{agent.id}/generate", {"prompt": "hi"}, format="json")

    assert response.status_code == 502
    assert response.json()["detail"].startswith("LLM provider error:")
    assert len(llm.chat_requests()) == 3  # LLM_MAX_ATTEMPTS in the llm fixture
    assert stored_counts(actor) == (0, 0, 0)


@pytest.mark.parametrize("role", ROLES)
def test_every_member_may_generate(role, org, make_user, api_client_for, llm):
    creator = make_user(org, role=Role.MEMBER, username="creator")
    agent = new_agent(Actor(organization_id=org.id, user_id=creator.id, role=Role.MEMBER))
    kind = {"owner": Role.OWNER, "admin": Role.ADMIN, "creator": Role.MEMBER, "member": Role.MEMBER}[role]
    person = creator if role == "creator" else make_user(org, role=kind, username=role)
    llm.push(text("Hi"))

    response = api_client_for(Actor(organization_id=org.id, user_id=person.id, role=kind)).post(
        f"/v1/agents/{agent.id}/generate", {"prompt": "hello"}, format="json"
    )

    assert response.status_code == 200


# --- tenancy ----------------------------------------------------------------------------------------------

AGENT_OPS = [
    ("/v1/agents/{agent}/recompile", None),
    ("/v1/agents/{agent}/summarize", {}),
    ("/v1/agents/{agent}/generate", {"prompt": "hi"}),
]


@pytest.mark.parametrize(("path", "body"), AGENT_OPS)
def test_another_organisation_gets_404_and_nothing_happens(
    api_client_for, actor, other_org_actor, llm, path, body
):
    agent = new_agent(actor)
    seed(actor, agent, None, "a", "b", "c", "d")

    response = api_client_for(other_org_actor).post(path.format(agent=agent.id), body, format="json")

    assert response.status_code == 404
    assert len(Agent.objects.for_actor(actor).get().message_ids) == 4
    assert llm.chat_requests() == []


@pytest.mark.parametrize(("path", "body"), AGENT_OPS)
def test_no_key_is_401(actor, path, body):
    agent = new_agent(actor)

    response = APIClient().post(path.format(agent=agent.id), body, format="json")

    assert response.status_code == 401
