"""The ADE's agent pages: list with search and tag filter, create from templates, clone, delete, Agent Files."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from apps.accounts.models import Organization, User
from apps.agents.models import Agent, AgentSecret, AgentType
from apps.agents.services import BlockSpec, agent_create
from apps.core.actor import Actor, Role
from apps.tools.services import tool_upsert

HTMX = {"HTTP_HX_REQUEST": "true"}
TOOL_SOURCE = '''
def lookup_order(order_id: str) -> str:
    """Look up an order.

    Args:
        order_id: The order's id.
    """
    return order_id
'''


@pytest.fixture
def make(actor: Actor) -> Callable[..., Agent]:
    def create(name: str, **kwargs: Any) -> Agent:
        kwargs.setdefault("model", "openai/scripted-chat")
        return agent_create(actor=actor, name=name, **kwargs)

    return create


def names_in(response: Any) -> list[str]:
    html = response.content.decode()
    return [part.split('"', 1)[0] for part in html.split('data-agent-name="')[1:]]


# --- list ---------------------------------------------------------------------------------------------------


def test_list_shows_name_model_tags_and_workspace_link(
    owner_client: Client, make: Callable[..., Agent]
) -> None:
    agent = make("Travel planner", tags=["travel", "prod"])

    response = owner_client.get("/agents/")

    html = response.content.decode()
    assert response.status_code == 200
    assert names_in(response) == ["Travel planner"]
    assert "openai/scripted-chat" in html
    assert f'href="/agents/{agent.id}/"' in html
    assert 'data-testid="tag-filter-travel"' in html
    assert "ago</time>" in html


def test_search_answers_only_the_results_partial_for_htmx(
    owner_client: Client, make: Callable[..., Agent]
) -> None:
    make("Travel planner")
    make("Support bot")

    response = owner_client.get("/agents/?q=travel", HTTP_HX_TARGET="agent-results", **HTMX)

    assert response.status_code == 200
    assert names_in(response) == ["Travel planner"]
    assert "<html" not in response.content.decode()


def test_tag_filter_keeps_only_agents_with_that_tag(owner_client: Client, make: Callable[..., Agent]) -> None:
    make("One", tags=["alpha"])
    make("Two", tags=["beta"])
    make("Three", tags=["alpha", "beta"])

    response = owner_client.get("/agents/?tag=alpha")

    assert sorted(names_in(response)) == ["One", "Three"]


def test_search_without_match_says_so(owner_client: Client, make: Callable[..., Agent]) -> None:
    make("Travel planner")

    response = owner_client.get("/agents/?q=zebra", HTTP_HX_TARGET="agent-results", **HTMX)

    assert names_in(response) == []
    assert "No agent matches “zebra”" in response.content.decode()


def test_list_never_shows_another_organisations_agents(
    owner_client: Client, make: Callable[..., Agent], other_org_actor: Actor
) -> None:
    make("Mine")
    agent_create(actor=other_org_actor, name="Theirs", model="openai/x")

    response = owner_client.get("/agents/")

    assert names_in(response) == ["Mine"]


@pytest.mark.parametrize("page", ["/agents/", "/agents/new/"])
def test_no_provider_banner_when_nothing_is_configured(
    owner_client: Client, settings: Any, page: str
) -> None:
    settings.OPENAI_API_KEY = settings.OPENAI_BASE_URL = ""
    settings.ANTHROPIC_API_KEY = settings.OLLAMA_BASE_URL = ""

    response = owner_client.get(page)

    assert 'data-testid="no-provider-banner"' in response.content.decode()


def test_no_banner_when_a_provider_serves_models(owner_client: Client, llm: Any) -> None:
    response = owner_client.get("/agents/")

    assert response.status_code == 200
    assert 'data-testid="no-provider-banner"' not in response.content.decode()


def test_create_page_offers_templates_and_the_providers_models(owner_client: Client, llm: Any) -> None:
    response = owner_client.get("/agents/new/")

    html = response.content.decode()
    assert response.status_code == 200
    for title in ("Personal assistant", "Assistant with sleeptime memory agent", "Blank agent"):
        assert title in html
    assert '<option value="openai/scripted-chat" selected>' in html
    assert '<option value="openai/text-embedding-3-small"' in html


def post_create(client: Client, **fields: str) -> Any:
    data = {
        "template": "personal-assistant",
        "name": "Helper",
        "model": "openai/scripted-chat",
        "embedding": "",
    }
    return client.post("/agents/new/", {**data, **fields}, **HTMX)


def test_personal_assistant_template_creates_human_and_persona_blocks(
    owner_client: Client, actor: Actor, llm: Any
) -> None:
    response = post_create(owner_client, embedding="openai/text-embedding-3-small")

    agent = Agent.objects.for_actor(actor).get(name="Helper")
    assert response.status_code == 204
    assert response["HX-Redirect"] == f"/agents/{agent.id}/"
    assert sorted(agent.blocks.values_list("label", flat=True)) == ["human", "persona"]
    assert agent.model == "openai/scripted-chat"
    assert agent.embedding == "openai/text-embedding-3-small"
    assert agent.enable_sleeptime is False
    assert agent.tools.exists()


def test_sleeptime_template_creates_a_sleeptime_agent_sharing_the_blocks(
    owner_client: Client, actor: Actor, llm: Any
) -> None:
    post_create(owner_client, template="sleeptime", name="Dreamer")

    agent = Agent.objects.for_actor(actor).get(name="Dreamer")
    assert agent.enable_sleeptime is True
    assert agent.sleeptime_agent is not None
    assert agent.sleeptime_agent.agent_type == AgentType.SLEEPTIME
    assert set(agent.sleeptime_agent.blocks.values_list("id", flat=True)) == set(
        agent.blocks.values_list("id", flat=True)
    )


def test_blank_template_with_a_system_prompt_creates_an_agent_without_blocks(
    owner_client: Client, actor: Actor, llm: Any
) -> None:
    post_create(owner_client, template="blank", name="Scratch", system="You answer in haiku.")

    agent = Agent.objects.for_actor(actor).get(name="Scratch")
    assert agent.blocks.count() == 0
    assert agent.system == "You answer in haiku."


def test_a_typed_handle_wins_over_the_selected_one(owner_client: Client, actor: Actor, llm: Any) -> None:
    post_create(owner_client, model_other="openai/my-finetune")

    assert Agent.objects.for_actor(actor).get(name="Helper").model == "openai/my-finetune"


def test_bad_name_is_refused_with_a_message_and_nothing_created(
    owner_client: Client, actor: Actor, llm: Any
) -> None:
    response = post_create(owner_client, name="bad/name!")

    assert response.status_code == 422
    assert "Invalid agent name" in response.content.decode()
    assert not Agent.objects.for_actor(actor).exists()


def test_unknown_model_handle_is_refused_with_a_message(owner_client: Client, actor: Actor, llm: Any) -> None:
    response = post_create(owner_client, model="nosuchprovider/model")

    assert response.status_code == 422
    assert "nosuchprovider" in response.content.decode()
    assert not Agent.objects.for_actor(actor).exists()


def test_handle_without_provider_is_refused(owner_client: Client, actor: Actor, llm: Any) -> None:
    response = post_create(owner_client, model="gpt-4o")

    assert response.status_code == 422
    assert "expected &#x27;provider/model-name&#x27;" in response.content.decode()


# --- clone --------------------------------------------------------------------------------------------------


def test_clone_copies_blocks_independently_and_keeps_tools_rules_and_secrets(
    owner_client: Client, actor: Actor, make: Callable[..., Agent]
) -> None:
    custom = tool_upsert(actor=actor, source_code=TOOL_SOURCE)
    source = make(
        "Support",
        system="Be kind.",
        memory_blocks=[BlockSpec(label="persona", value="I help.")],
        tool_ids=[custom.id],
        tool_rules=[{"type": "max_count_per_step", "tool_name": "lookup_order", "max_count_limit": 2}],
        tags=["support"],
        secrets_={"API_KEY": "s3cret"},
        context_window_limit=16000,
    )

    response = owner_client.post(f"/agents/{source.id}/clone/", **HTMX)

    clone = Agent.objects.for_actor(actor).get(name="Support copy")
    assert response.status_code == 200
    assert 'data-agent-name="Support copy"' in response.content.decode()
    assert clone.system == "Be kind."
    assert clone.tags == ["support"]
    assert clone.context_window_limit == 16000
    assert clone.tool_rules == source.tool_rules
    assert set(clone.tools.values_list("id", flat=True)) == set(source.tools.values_list("id", flat=True))
    assert AgentSecret.objects.for_actor(actor).get(agent=clone, key="API_KEY").value == "s3cret"
    clone_block = clone.blocks.get(label="persona")
    assert clone_block.id != source.blocks.get(label="persona").id
    clone_block.value = "Changed in the clone."
    clone_block.save()
    assert source.blocks.get(label="persona").value == "I help."


def test_clone_of_a_sleeptime_agent_gets_its_own_sleeptime_agent(
    owner_client: Client, actor: Actor, make: Callable[..., Agent]
) -> None:
    source = make("Dreamer", enable_sleeptime=True, memory_blocks=[BlockSpec(label="human")])

    owner_client.post(f"/agents/{source.id}/clone/", **HTMX)

    clone = Agent.objects.for_actor(actor).get(name="Dreamer copy")
    assert clone.enable_sleeptime is True
    assert clone.sleeptime_agent_id not in (None, source.sleeptime_agent_id)


# --- delete -------------------------------------------------------------------------------------------------


def test_delete_asks_for_confirmation_first(owner_client: Client, make: Callable[..., Agent]) -> None:
    agent = make("Doomed")

    response = owner_client.get(f"/agents/{agent.id}/delete/", **HTMX)

    assert response.status_code == 200
    assert "Delete <strong>Doomed</strong>?" in response.content.decode()
    assert Agent.all_objects.filter(id=agent.id).exists()


def test_delete_removes_the_agent_and_answers_a_flash(
    owner_client: Client, make: Callable[..., Agent]
) -> None:
    agent = make("Doomed")

    response = owner_client.post(f"/agents/{agent.id}/delete/", **HTMX)

    assert response.status_code == 200
    assert "Deleted “Doomed”." in response.content.decode()
    assert not Agent.all_objects.filter(id=agent.id).exists()


def test_member_cannot_delete_someone_elses_agent(
    client: Client, org: Organization, make_user: Callable[..., User], make: Callable[..., Agent]
) -> None:
    agent = make("Owned by alice")
    client.force_login(make_user(org, role=Role.MEMBER))

    response = client.post(f"/agents/{agent.id}/delete/", **HTMX)

    assert response.status_code == 403
    assert Agent.all_objects.filter(id=agent.id).exists()


def test_member_can_delete_an_agent_they_created(
    client: Client, org: Organization, make_user: Callable[..., User]
) -> None:
    member = make_user(org, role=Role.MEMBER)
    agent = agent_create(
        actor=Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER),
        name="Mine",
        model="openai/x",
    )
    client.force_login(member)

    response = client.post(f"/agents/{agent.id}/delete/", **HTMX)

    assert response.status_code == 200
    assert not Agent.all_objects.filter(id=agent.id).exists()


# --- Agent Files --------------------------------------------------------------------------------------------


def test_export_downloads_an_agent_file_without_secret_values(
    owner_client: Client, make: Callable[..., Agent]
) -> None:
    agent = make(
        "Exported agent", secrets_={"API_KEY": "s3cret-value"}, memory_blocks=[BlockSpec(label="human")]
    )

    response = owner_client.get(f"/agents/{agent.id}/export/")

    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="Exported-agent.af"'
    document = json.loads(response.content)
    assert document["agents"][0]["name"] == "Exported agent"
    assert document["agents"][0]["secrets"] == {"API_KEY": ""}
    assert "s3cret-value" not in response.content.decode()


def test_import_round_trips_an_exported_agent_and_lists_it(
    owner_client: Client, actor: Actor, make: Callable[..., Agent]
) -> None:
    agent = make("Roundtrip", memory_blocks=[BlockSpec(label="persona", value="Me.")], tags=["x"])
    exported = owner_client.get(f"/agents/{agent.id}/export/").content

    response = owner_client.post(
        "/agents/import/", {"file": SimpleUploadedFile("Roundtrip.af", exported)}, **HTMX
    )

    imported = Agent.objects.for_actor(actor).get(name="Roundtrip_copy")
    html = response.content.decode()
    assert response.status_code == 200
    assert "Imported" in html
    assert 'id="agent-results" hx-swap-oob="true"' in html
    assert 'data-agent-name="Roundtrip_copy"' in html
    assert imported.blocks.get(label="persona").value == "Me."
    assert imported.tags == ["x"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "Corrupted agent file format."),
        (b'{"agent_type": "memgpt_agent"}', "Legacy AgentSchema format is deprecated"),
        (b'{"agents": [{"id": "agent-0", "block_ids": ["block-9"]}]}', "references unknown block block-9"),
    ],
)
def test_import_of_a_bad_file_says_what_is_wrong(
    owner_client: Client, actor: Actor, content: bytes, message: str
) -> None:
    response = owner_client.post("/agents/import/", {"file": SimpleUploadedFile("bad.af", content)}, **HTMX)

    assert response.status_code == 422
    assert message in response.content.decode()
    assert not Agent.objects.for_actor(actor).exists()


def test_import_without_a_file_asks_for_one(owner_client: Client) -> None:
    response = owner_client.post("/agents/import/", {}, **HTMX)

    assert response.status_code == 422
    assert "Choose an Agent File (.af) to import." in response.content.decode()


# --- tenancy --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "suffix"),
    [
        ("get", "row/"),
        ("post", "clone/"),
        ("get", "delete/"),
        ("post", "delete/"),
        ("get", "export/"),
    ],
)
def test_another_organisations_agent_is_not_found(
    owner_client: Client, other_org_actor: Actor, method: str, suffix: str
) -> None:
    theirs = agent_create(actor=other_org_actor, name="Theirs", model="openai/x")

    response = getattr(owner_client, method)(f"/agents/{theirs.id}/{suffix}", **HTMX)

    assert response.status_code == 404
    assert list(Agent.all_objects.values_list("name", flat=True)) == ["Theirs"]


def test_pages_need_sign_in(client: Client) -> None:
    response = client.get("/agents/new/")

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")
