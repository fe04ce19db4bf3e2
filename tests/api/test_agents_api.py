"""/v1/agents (CRUD, agent tools) and /v1/tags through DRF's APIClient."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import Resolver404, resolve
from rest_framework.test import APIClient

from apps.agents.models import Agent, AgentSecret, AgentTool
from apps.agents.prompts import DEFAULT_SYSTEM_PROMPT
from apps.agents.services import BlockSpec, agent_create
from apps.agents.system_messages import thread_system_message_id
from apps.api.views.agents import AgentDetailApi
from apps.memory.models import AgentBlock, Block
from tests.factories import AgentFactory, BlockFactory, MessageFactory, ToolFactory

BASE_TOOLS = ["conversation_search", "memory_insert", "memory_replace"]
SDK_HEADERS = {"HTTP_X_STAINLESS_PACKAGE_VERSION": "1.12.1"}
LEGACY_HEADERS = {"HTTP_USER_AGENT": "python-requests/2.32.3"}  # a pre-1.0 client, to Letta


def create_body(**overrides):
    return {
        "name": "Assistant",
        "model": "openai/gpt-4o-mini",
        "embedding": "openai/text-embedding-3-small",
        "memory_blocks": [
            {"label": "human", "value": "Name: Sam", "limit": 5000},
            {"label": "persona", "value": "I am helpful"},
        ],
        "tags": ["b", "a"],
    } | overrides


def make_agent(actor, **kwargs):
    kwargs.setdefault("name", "Assistant")
    kwargs.setdefault("model", "openai/gpt-4o-mini")
    kwargs.setdefault("memory_blocks", [BlockSpec(label="human", value="Name: Sam")])
    return agent_create(actor=actor, **kwargs)


# --- create ------------------------------------------------------------------------------------------------


def test_create_returns_the_agent_state_the_sdk_reads(actor, api_client_for, settings):
    settings.OPENAI_API_KEY = "sk-test"

    response = api_client_for(actor).post("/v1/agents/", create_body(), format="json")

    assert response.status_code == 200
    body = response.json()
    assert body["id"].startswith("agent-")
    assert (body["name"], body["agent_type"], body["system"]) == (
        "Assistant",
        "letta_v1_agent",
        DEFAULT_SYSTEM_PROMPT,
    )
    assert (body["model"], body["embedding"]) == ("openai/gpt-4o-mini", "openai/text-embedding-3-small")
    assert {
        k: body["llm_config"][k] for k in ("model", "model_endpoint_type", "handle", "context_window")
    } == {
        "model": "gpt-4o-mini",
        "model_endpoint_type": "openai",
        "handle": "openai/gpt-4o-mini",
        "context_window": 32768,
    }
    assert body["embedding_config"] == {
        "embedding_model": "text-embedding-3-small",
        "embedding_endpoint_type": "openai",
        "embedding_endpoint": "https://api.openai.com/v1",
        "embedding_dim": 1536,
        "embedding_chunk_size": None,
        "handle": "openai/text-embedding-3-small",
    }
    assert [b["label"] for b in body["blocks"]] == ["human", "persona"]
    assert body["memory"]["blocks"] == body["blocks"]
    assert body["blocks"][0]["limit"] == 5000
    assert sorted(t["name"] for t in body["tools"]) == BASE_TOOLS
    assert body["tags"] == ["a", "b"]
    assert (body["sources"], body["secrets"], body["tool_rules"]) == ([], [], [])
    assert body["message_ids"] == [
        thread_system_message_id(body["id"], None)
    ]  # its system message, as on Letta
    assert body["created_by_id"] == actor.user_id
    assert body["timezone"] == "UTC"


def test_tools_in_agent_state_have_the_full_tool_shape(actor, api_client_for):
    response = api_client_for(actor).post("/v1/agents/", create_body(), format="json")

    tool = next(t for t in response.json()["tools"] if t["name"] == "memory_insert")
    assert set(tool) >= {
        "id",
        "name",
        "description",
        "tool_type",
        "source_type",
        "source_code",
        "json_schema",
        "return_char_limit",
        "tags",
        "pip_requirements",
        "default_requires_approval",
        "metadata_",
    }
    assert tool["tool_type"] == "letta_sleeptime_core"
    assert tool["json_schema"]["name"] == "memory_insert"


def test_create_accepts_the_body_the_sdk_sends(actor, api_client_for):
    body = {
        "context_window_limit": 16000,
        "embedding": "openai/text-embedding-3-small",
        "enable_sleeptime": False,
        "include_base_tools": True,
        "memory_blocks": [
            {"label": "human", "value": "Name: Bob", "limit": 5000},
            {"label": "persona", "value": "x"},
        ],
        "model": "openai/gpt-4o-mini",
        "name": "a",
        "tags": ["x", "y"],
        "tool_rules": [
            {"type": "exit_loop", "tool_name": "send_message"},
            {"type": "constrain_child_tools", "tool_name": "a", "children": ["b"]},
        ],
        "tools": ["archival_memory_search"],
    }

    response = api_client_for(actor).post("/v1/agents/", body, format="json")

    assert response.status_code == 200
    state = response.json()
    assert state["llm_config"]["context_window"] == 16000
    assert sorted(t["name"] for t in state["tools"]) == sorted([*BASE_TOOLS, "archival_memory_search"])
    assert state["tool_rules"] == body["tool_rules"]


def test_create_with_model_settings_fills_llm_config_and_keeps_extras(actor, api_client_for):
    settings_in = {
        "provider_type": "openai",
        "temperature": 0.2,
        "max_output_tokens": 512,
        "parallel_tool_calls": True,
        "reasoning": {"reasoning_effort": "low"},
    }

    response = api_client_for(actor).post(
        "/v1/agents/", create_body(model_settings=settings_in), format="json"
    )

    state = response.json()
    llm = state["llm_config"]
    assert (llm["temperature"], llm["max_tokens"], llm["parallel_tool_calls"]) == (0.2, 512, True)
    assert state["model_settings"] == settings_in
    agent = Agent.objects.for_actor(actor).get(id=state["id"])
    assert agent.model_settings == {"reasoning": {"reasoning_effort": "low"}}


def test_create_folds_deprecated_fields_into_their_replacements(actor, api_client_for):
    body = {
        "name": "legacy",
        "llm_config": {
            "handle": "openai/gpt-4o",
            "context_window": 8000,
            "model": "gpt-4o",
            "temperature": 0.1,
        },
        "embedding_config": {"handle": "openai/text-embedding-3-large", "embedding_dim": 3072},
        "max_tokens": 300,
        "tool_exec_environment_variables": {"TOKEN": "abc"},
        "project_id": "ignored",  # Letta: "Deprecated: No longer used"
        "template": False,
    }

    response = api_client_for(actor).post("/v1/agents/", body, format="json")

    state = response.json()
    assert response.status_code == 200
    assert (state["model"], state["embedding"]) == ("openai/gpt-4o", "openai/text-embedding-3-large")
    assert (state["llm_config"]["context_window"], state["llm_config"]["max_tokens"]) == (8000, 300)
    assert state["llm_config"]["temperature"] == 0.1
    assert [s["key"] for s in state["secrets"]] == ["TOKEN"]


def test_secrets_are_stored_but_their_values_are_never_returned(actor, api_client_for):
    response = api_client_for(actor).post(
        "/v1/agents/", create_body(secrets={"API_TOKEN": "s3cr3t-value"}), format="json"
    )

    state = response.json()
    assert [(s["key"], s["value"]) for s in state["secrets"]] == [("API_TOKEN", None)]
    assert state["tool_exec_environment_variables"] == state["secrets"]
    assert "s3cr3t-value" not in response.content.decode()
    assert AgentSecret.objects.for_actor(actor).get(agent_id=state["id"]).value == "s3cr3t-value"


def test_create_without_base_tools_attaches_only_the_named_ones(actor, api_client_for):
    tool = ToolFactory(organization_id=actor.organization_id, name="lookup")

    response = api_client_for(actor).post(
        "/v1/agents/", create_body(include_base_tools=False, tool_ids=[tool.id]), format="json"
    )

    assert [t["id"] for t in response.json()["tools"]] == [tool.id]


def test_include_base_tool_rules_adds_loop_rules_for_the_base_tools(actor, api_client_for):
    response = api_client_for(actor).post(
        "/v1/agents/", create_body(agent_type="memgpt_v2_agent", include_base_tool_rules=True), format="json"
    )

    assert response.json()["tool_rules"] == [
        {"type": "continue_loop", "tool_name": "conversation_search"},
        {"type": "continue_loop", "tool_name": "memory_insert"},
        {"type": "continue_loop", "tool_name": "memory_replace"},
        {"type": "exit_loop", "tool_name": "send_message"},
    ]


def test_create_with_an_unknown_tool_name_is_400_and_creates_nothing(actor, api_client_for):
    response = api_client_for(actor).post("/v1/agents/", create_body(tools=["no_such_tool"]), format="json")

    assert response.status_code == 400
    assert response.json()["detail"] == "Unknown tool name(s): no_such_tool"
    assert Agent.objects.for_actor(actor).count() == 0
    assert Block.objects.for_actor(actor).count() == 0


@pytest.mark.parametrize(
    ("overrides", "status", "message"),
    [
        ({"name": "bad/name"}, 400, "Invalid agent name 'bad/name'"),
        ({"model": "gpt-4o-mini"}, 400, "Invalid model handle 'gpt-4o-mini'"),
        ({"embedding": "nomic"}, 400, "Invalid embedding handle 'nomic'"),
        ({"timezone": "Mars/Olympus"}, 400, "Unknown timezone 'Mars/Olympus'"),
        ({"tool_rules": [{"type": "teleport", "tool_name": "x"}]}, 400, "unknown rule type 'teleport'"),
        ({"memory_blocks": [{"label": "h", "value": "x" * 6, "limit": 5}]}, 400, "over its limit of 5"),
        (
            {"memory_blocks": [{"label": "h", "value": "a"}, {"label": "h", "value": "b"}]},
            400,
            "more than one block labelled: h",
        ),
        ({"agent_type": "wizard"}, 422, "agent_type"),
        ({"memory_blocks": [{"label": "human"}]}, 422, "memory_blocks"),
        ({"tags": "not-a-list"}, 422, "tags"),
        ({"context_window_limit": 0}, 422, "context_window_limit"),
    ],
)
def test_invalid_create_bodies_are_refused_and_write_nothing(
    actor, api_client_for, overrides, status, message
):
    response = api_client_for(actor).post("/v1/agents/", create_body(**overrides), format="json")

    assert response.status_code == status
    assert message in response.json()["detail"]
    assert Agent.objects.for_actor(actor).count() == 0


def test_a_context_window_limit_above_the_models_is_400_when_the_model_is_known(
    actor, api_client_for, settings
):
    settings.OPENAI_API_KEY = "sk-test"
    agent = make_agent(actor)
    client = api_client_for(actor)

    created = client.post("/v1/agents/", create_body(context_window_limit=500_000), format="json")
    patched = client.patch(f"/v1/agents/{agent.id}", {"context_window_limit": 500_000}, format="json")

    message = "Context window limit 500000 is larger than openai/gpt-4o-mini's maximum of 128000 tokens."
    assert (created.status_code, created.json()["detail"]) == (400, message)
    assert (patched.status_code, patched.json()["detail"]) == (400, message)
    assert Agent.objects.for_actor(actor).count() == 1
    agent.refresh_from_db()
    assert agent.context_window_limit is None


def test_create_with_another_organisations_block_is_404_and_creates_nothing(
    actor, other_org_actor, api_client_for
):
    foreign = BlockFactory(organization_id=other_org_actor.organization_id)

    response = api_client_for(actor).post("/v1/agents/", create_body(block_ids=[foreign.id]), format="json")

    assert response.status_code == 404
    assert response.json()["detail"] == f"Block with id '{foreign.id}' not found"
    assert Agent.objects.for_actor(actor).count() == 0
    assert not AgentBlock.objects.filter(block=foreign).exists()


def test_an_agent_without_a_name_gets_one(actor, api_client_for):
    response = api_client_for(actor).post("/v1/agents/", {}, format="json")

    assert response.status_code == 200
    assert response.json()["name"].startswith("agent-")
    assert response.json()["model"] is None


# --- retrieve / list ---------------------------------------------------------------------------------------


def test_retrieve_returns_the_agent(actor, api_client_for):
    agent = make_agent(actor, tags=["t"])

    response = api_client_for(actor).get(f"/v1/agents/{agent.id}", {"include": "agent.tags"})

    assert response.status_code == 200
    assert (response.json()["id"], response.json()["tags"]) == (agent.id, ["t"])


def test_unknown_agent_is_404_with_letta_wording(actor, api_client_for):
    response = api_client_for(actor).get("/v1/agents/agent-00000000-0000-4000-8000-000000000000")

    assert response.status_code == 404
    assert response.json()["detail"] == "Agent with id 'agent-00000000-0000-4000-8000-000000000000' not found"


def test_an_unresolvable_model_handle_is_still_described(actor, api_client_for):
    agent = make_agent(actor, model="mystery/model-x", context_window_limit=4000)

    llm = api_client_for(actor).get(f"/v1/agents/{agent.id}").json()["llm_config"]

    assert (llm["model"], llm["handle"], llm["context_window"], llm["model_endpoint_type"]) == (
        "model-x",
        "mystery/model-x",
        4000,
        "openai",
    )


def test_list_shows_only_the_callers_organisation_newest_first(actor, other_org_actor, api_client_for):
    first = AgentFactory(organization_id=actor.organization_id)
    second = AgentFactory(organization_id=actor.organization_id)
    AgentFactory(organization_id=other_org_actor.organization_id)

    response = api_client_for(actor).get("/v1/agents/")

    assert [a["id"] for a in response.json()] == [second.id, first.id]


def test_list_filters_by_name_query_text_and_tags(actor, api_client_for):
    red = AgentFactory(organization_id=actor.organization_id, name="Red fox", tags=["animal", "red"])
    blue = AgentFactory(organization_id=actor.organization_id, name="Blue whale", tags=["animal", "blue"])
    AgentFactory(organization_id=actor.organization_id, name="Red car", tags=["red", "vehicle"])
    client = api_client_for(actor)

    def ids(query):
        return sorted(a["id"] for a in client.get("/v1/agents/", query).json())

    assert ids({"name": "Red fox"}) == [red.id]
    assert len(ids({"query_text": "red"})) == 2
    assert ids({"tags": ["animal"], "match_all_tags": "true"}) == sorted([red.id, blue.id])
    assert ids({"tags": ["animal", "red"], "match_all_tags": "true"}) == [red.id]
    assert len(ids({"tags": ["blue", "vehicle"]})) == 2


def test_list_pagination_honours_after_until_an_empty_page(actor, api_client_for):
    ids = [AgentFactory(organization_id=actor.organization_id).id for _ in range(5)]
    client = api_client_for(actor)

    seen, after, pages = [], None, 0
    while pages < 10:
        page = client.get(
            "/v1/agents/", {"limit": 2, "order": "asc"} | ({"after": after} if after else {})
        ).json()
        pages += 1
        if not page:
            break
        seen += [a["id"] for a in page]
        after = page[-1]["id"]

    assert seen == ids
    assert pages == 4


def test_list_honours_before_and_the_deprecated_ascending_flag(actor, api_client_for):
    ids = [AgentFactory(organization_id=actor.organization_id).id for _ in range(3)]
    client = api_client_for(actor)

    ascending = client.get("/v1/agents/", {"ascending": "true"}).json()
    before_asc = client.get("/v1/agents/", {"before": ids[2], "order": "asc"}).json()
    before_desc = client.get("/v1/agents/", {"before": ids[0]}).json()

    assert [a["id"] for a in ascending] == ids
    assert [a["id"] for a in before_asc] == [ids[0], ids[1]]
    assert [a["id"] for a in before_desc] == [ids[2], ids[1]]


def test_list_bad_query_is_422(actor, api_client_for):
    response = api_client_for(actor).get("/v1/agents/", {"last_stop_reason": "bored"})

    assert response.status_code == 422
    assert "last_stop_reason" in response.json()["detail"]


def _list_query_count(client) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/v1/agents/")
    assert response.status_code == 200
    return len(queries)


def test_listing_agents_costs_a_fixed_number_of_queries(actor, api_client_for, settings):
    settings.OPENAI_API_KEY = "sk-test"
    client = api_client_for(actor)
    tool = ToolFactory(organization_id=actor.organization_id)

    def add_agents(n):
        for i in range(n):
            agent = make_agent(
                actor,
                name=f"a{i}",
                embedding="openai/text-embedding-3-small",
                tool_ids=[tool.id],
                secrets_={"K": "v"},
                memory_blocks=[BlockSpec(label="human", value="x"), BlockSpec(label="persona", value="y")],
            )
            assert agent.tools.count() == 4

    client.get("/v1/tags/")  # the key's first use records last_used_at: keep it out of the counts
    add_agents(2)
    with_two = _list_query_count(client)
    add_agents(4)
    with_six = _list_query_count(client)

    assert with_six == with_two
    assert len(client.get("/v1/agents/").json()) == 6


def test_listing_agents_stays_within_a_small_query_budget(
    actor, api_client_for, django_assert_max_num_queries
):
    client = api_client_for(actor)
    for i in range(6):
        make_agent(actor, name=f"a{i}", embedding="openai/text-embedding-3-small")

    client.get("/v1/tags/")
    with django_assert_max_num_queries(10):
        response = client.get("/v1/agents/")

    assert len(response.json()) == 6


# --- update ------------------------------------------------------------------------------------------------


def test_patch_changes_only_the_given_fields(actor, api_client_for):
    agent = make_agent(actor, description="keep me", tags=["old"], system="Be brief.")

    response = api_client_for(actor).patch(f"/v1/agents/{agent.id}", {"name": "Renamed"}, format="json")

    state = response.json()
    assert response.status_code == 200
    assert (state["name"], state["description"], state["tags"], state["system"]) == (
        "Renamed",
        "keep me",
        ["old"],
        "Be brief.",
    )


def test_patch_null_clears_and_absent_keeps(actor, api_client_for):
    agent = make_agent(
        actor, description="d", tags=["x"], metadata={"a": 1}, system="S", context_window_limit=4000
    )

    response = api_client_for(actor).patch(
        f"/v1/agents/{agent.id}",
        {"description": None, "tags": None, "system": None, "context_window_limit": None},
        format="json",
    )

    state = response.json()
    assert (state["description"], state["tags"], state["system"]) == ("", [], DEFAULT_SYSTEM_PROMPT)
    assert state["context_window_limit"] is None
    assert state["metadata"] == {"a": 1}


def test_patch_null_name_is_422(actor, api_client_for):
    agent = make_agent(actor)

    response = api_client_for(actor).patch(f"/v1/agents/{agent.id}", {"name": None}, format="json")

    assert response.status_code == 422
    assert "name" in response.json()["detail"]
    agent.refresh_from_db()
    assert agent.name == "Assistant"


def test_patch_list_fields_replace_the_whole_set(actor, api_client_for):
    keep, drop, add = (ToolFactory(organization_id=actor.organization_id) for _ in range(3))
    shared = BlockFactory(organization_id=actor.organization_id, label="shared")
    agent = make_agent(actor, include_base_tools=False, tool_ids=[keep.id, drop.id], tags=["a", "b"])
    human = agent.blocks.get(label="human")

    response = api_client_for(actor).patch(
        f"/v1/agents/{agent.id}",
        {"tool_ids": [keep.id, add.id], "block_ids": [shared.id], "tags": ["c"]},
        format="json",
    )

    state = response.json()
    assert sorted(t["id"] for t in state["tools"]) == sorted([keep.id, add.id])
    assert [b["id"] for b in state["blocks"]] == [shared.id]
    assert state["tags"] == ["c"]
    assert Block.objects.for_actor(actor).filter(id=human.id).exists()


def test_patch_block_ids_with_two_blocks_of_one_label_is_400_and_changes_nothing(actor, api_client_for):
    one = BlockFactory(organization_id=actor.organization_id, label="notes")
    two = BlockFactory(organization_id=actor.organization_id, label="notes")
    agent = make_agent(actor)

    response = api_client_for(actor).patch(
        f"/v1/agents/{agent.id}", {"block_ids": [one.id, two.id], "name": "changed"}, format="json"
    )

    assert response.status_code == 400
    assert "already has a block labelled 'notes'" in response.json()["detail"]
    agent.refresh_from_db()
    assert agent.name == "Assistant"
    assert list(agent.blocks.values_list("label", flat=True)) == ["human"]


def test_patch_validates_tool_rules(actor, api_client_for):
    agent = make_agent(actor, tool_rules=[{"type": "exit_loop", "tool_name": "x"}])

    response = api_client_for(actor).patch(
        f"/v1/agents/{agent.id}",
        {"tool_rules": [{"type": "constrain_child_tools", "tool_name": "a"}]},
        format="json",
    )

    assert response.status_code == 400
    assert "tool_rules[0]" in response.json()["detail"]
    agent.refresh_from_db()
    assert agent.tool_rules == [{"type": "exit_loop", "tool_name": "x"}]


def test_patch_model_settings_and_model(actor, api_client_for, settings):
    settings.ANTHROPIC_API_KEY = "sk-ant-test"
    agent = make_agent(actor)

    response = api_client_for(actor).patch(
        f"/v1/agents/{agent.id}",
        {
            "model": "anthropic/claude-sonnet-4-5",
            "context_window_limit": 64000,
            "model_settings": {
                "provider_type": "anthropic",
                "temperature": 1.0,
                "thinking": {"type": "enabled"},
            },
        },
        format="json",
    )

    state = response.json()
    assert state["llm_config"]["model_endpoint_type"] == "anthropic"
    assert (state["llm_config"]["context_window"], state["llm_config"]["temperature"]) == (64000, 1.0)
    assert state["model_settings"]["thinking"] == {"type": "enabled"}
    assert state["model_settings"]["provider_type"] == "anthropic"


def test_patch_secrets_replace_the_set(actor, api_client_for):
    agent = make_agent(actor, secrets_={"OLD": "1", "KEEP": "2"})

    response = api_client_for(actor).patch(
        f"/v1/agents/{agent.id}", {"secrets": {"KEEP": "3", "NEW": "4"}}, format="json"
    )

    assert [s["key"] for s in response.json()["secrets"]] == ["KEEP", "NEW"]
    values = dict(AgentSecret.objects.for_actor(actor).filter(agent=agent).values_list("key", "value"))
    assert values == {"KEEP": "3", "NEW": "4"}


def test_patch_message_ids_must_be_the_agents_messages(actor, other_org_actor, api_client_for):
    agent = make_agent(actor)
    mine = MessageFactory(organization_id=actor.organization_id, agent=agent)
    other_agent = make_agent(actor, name="other")
    foreign = MessageFactory(organization_id=actor.organization_id, agent=other_agent)
    client = api_client_for(actor)

    ok = client.patch(f"/v1/agents/{agent.id}", {"message_ids": [mine.id]}, format="json")
    bad = client.patch(f"/v1/agents/{agent.id}", {"message_ids": [mine.id, foreign.id]}, format="json")

    assert ok.json()["message_ids"] == [thread_system_message_id(agent.id, None), mine.id]
    assert bad.status_code == 400
    assert bad.json()["detail"] == f"Messages not found on agent '{agent.id}': {foreign.id}"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"name": "no/slashes"}, 400, "Invalid agent name"),
        ({"model": "gpt-4o"}, 400, "Invalid model handle 'gpt-4o'"),
        ({"embedding": "nomic"}, 400, "Invalid embedding handle 'nomic'"),
        ({"timezone": "Nowhere/Land"}, 400, "Unknown timezone 'Nowhere/Land'"),
        ({"tool_ids": ["tool-missing"]}, 400, "Tool with id 'tool-missing' not found"),
        ({"block_ids": ["block-missing"]}, 404, "Block with id 'block-missing' not found"),
        ({"model": None}, 422, "model"),
        ({"tool_ids": None}, 422, "tool_ids"),
        ({"last_stop_reason": "bored"}, 422, "last_stop_reason"),
        ({"model_settings": {"temperature": "hot"}}, 422, "model_settings.temperature"),
    ],
)
def test_invalid_patch_bodies_are_refused_and_change_nothing(actor, api_client_for, body, status, message):
    tool = ToolFactory(organization_id=actor.organization_id)
    agent = make_agent(actor, include_base_tools=False, tool_ids=[tool.id], timezone_name="Europe/Paris")

    response = api_client_for(actor).patch(
        f"/v1/agents/{agent.id}", body | {"description": "new"}, format="json"
    )

    assert response.status_code == status
    assert message in response.json()["detail"]
    agent.refresh_from_db()
    assert (agent.description, agent.model, agent.timezone) == ("", "openai/gpt-4o-mini", "Europe/Paris")
    assert list(agent.tools.values_list("id", flat=True)) == [tool.id]
    assert list(agent.blocks.values_list("label", flat=True)) == ["human"]


def test_patch_ignores_fields_it_does_not_know(actor, api_client_for):
    agent = make_agent(actor)

    response = api_client_for(actor).patch(
        f"/v1/agents/{agent.id}",
        {"project_id": "p", "template_id": "t", "agent_type": "react_agent"},
        format="json",
    )

    assert response.status_code == 200
    assert response.json()["agent_type"] == "letta_v1_agent"


def test_patch_enable_sleeptime_creates_then_unlinks_the_sleeptime_agent(actor, api_client_for):
    agent = make_agent(actor, name="Main")
    client = api_client_for(actor)

    on = client.patch(f"/v1/agents/{agent.id}", {"enable_sleeptime": True}, format="json")
    agent.refresh_from_db()
    sleeptime = agent.sleeptime_agent
    off = client.patch(f"/v1/agents/{agent.id}", {"enable_sleeptime": False}, format="json")
    agent.refresh_from_db()

    assert on.json()["enable_sleeptime"] is True
    assert (sleeptime.name, sleeptime.agent_type) == ("Main-sleeptime", "sleeptime_agent")
    assert list(sleeptime.blocks.values_list("label", flat=True)) == ["human"]
    assert off.json()["enable_sleeptime"] is False
    assert agent.sleeptime_agent_id is None
    assert Agent.objects.for_actor(actor).filter(id=sleeptime.id).exists()


def test_patch_records_who_changed_it(actor, api_client_for):
    agent = AgentFactory(organization_id=actor.organization_id)

    response = api_client_for(actor).patch(f"/v1/agents/{agent.id}", {"description": "x"}, format="json")

    assert response.json()["last_updated_by_id"] == actor.user_id


# --- delete ------------------------------------------------------------------------------------------------


def test_delete_removes_the_agent_and_keeps_its_blocks(actor, api_client_for):
    agent = make_agent(actor)
    block_id = agent.blocks.get().id
    client = api_client_for(actor)

    response = client.delete(f"/v1/agents/{agent.id}")

    assert response.status_code == 200
    assert response.json() == {"message": f"Agent id={agent.id} successfully deleted"}
    assert client.get(f"/v1/agents/{agent.id}").status_code == 404
    assert Block.objects.for_actor(actor).filter(id=block_id).exists()


# --- agent tools -------------------------------------------------------------------------------------------


def test_agent_tools_list_defaults_to_ten_and_paginates(actor, api_client_for):
    tools = [ToolFactory(organization_id=actor.organization_id) for _ in range(12)]
    agent = make_agent(actor, include_base_tools=False, tool_ids=[t.id for t in tools])
    client = api_client_for(actor)

    first = client.get(f"/v1/agents/{agent.id}/tools").json()
    seen, after = [], None
    for _ in range(10):
        page = client.get(
            f"/v1/agents/{agent.id}/tools", {"order": "asc", "limit": 5} | ({"after": after} if after else {})
        ).json()
        if not page:
            break
        seen += [t["id"] for t in page]
        after = page[-1]["id"]

    assert len(first) == 10
    assert seen == [t.id for t in tools]


def test_attach_and_detach_a_tool_return_the_agent_state_to_a_pre_1_0_client(actor, api_client_for):
    tool = ToolFactory(organization_id=actor.organization_id)
    agent = make_agent(actor, include_base_tools=False)
    client = api_client_for(actor)

    attached = client.patch(f"/v1/agents/{agent.id}/tools/attach/{tool.id}", **LEGACY_HEADERS)
    again = client.patch(f"/v1/agents/{agent.id}/tools/attach/{tool.id}", **LEGACY_HEADERS)
    detached = client.patch(f"/v1/agents/{agent.id}/tools/detach/{tool.id}", **LEGACY_HEADERS)

    assert [t["id"] for t in attached.json()["tools"]] == [tool.id]
    assert [t["id"] for t in again.json()["tools"]] == [tool.id]
    assert detached.json()["tools"] == []


def test_attach_and_detach_a_tool_answer_null_to_the_1x_sdk(actor, api_client_for):
    tool = ToolFactory(organization_id=actor.organization_id)
    agent = make_agent(actor, include_base_tools=False)
    client = api_client_for(actor)

    attached = client.patch(f"/v1/agents/{agent.id}/tools/attach/{tool.id}", **SDK_HEADERS)
    is_attached = AgentTool.objects.filter(agent=agent, tool=tool).exists()
    detached = client.patch(f"/v1/agents/{agent.id}/tools/detach/{tool.id}", **SDK_HEADERS)

    assert (attached.status_code, attached.content, attached["Content-Type"]) == (
        200,
        b"null",
        "application/json",
    )
    assert is_attached
    assert detached.content == b"null"
    assert not AgentTool.objects.filter(agent=agent, tool=tool).exists()


def test_attaching_an_unknown_or_foreign_tool_is_404(actor, other_org_actor, api_client_for):
    foreign = ToolFactory(organization_id=other_org_actor.organization_id)
    agent = make_agent(actor, include_base_tools=False)
    client = api_client_for(actor)

    unknown = client.patch(f"/v1/agents/{agent.id}/tools/attach/tool-nope")
    other = client.patch(f"/v1/agents/{agent.id}/tools/attach/{foreign.id}")

    assert (unknown.status_code, unknown.json()["detail"]) == (404, "Tool with id 'tool-nope' not found")
    assert (other.status_code, other.json()["detail"]) == (404, f"Tool with id '{foreign.id}' not found")
    assert not AgentTool.objects.filter(agent=agent).exists()


# --- tags --------------------------------------------------------------------------------------------------


def test_tags_are_distinct_sorted_and_scoped(actor, other_org_actor, api_client_for):
    AgentFactory(organization_id=actor.organization_id, tags=["beta", "alpha"])
    AgentFactory(organization_id=actor.organization_id, tags=["beta", "gamma"])
    AgentFactory(organization_id=other_org_actor.organization_id, tags=["secret"])
    client = api_client_for(actor)

    assert client.get("/v1/tags/").json() == ["alpha", "beta", "gamma"]
    assert client.get("/v1/tags/", {"order": "desc"}).json() == ["gamma", "beta", "alpha"]
    assert client.get("/v1/tags/", {"query_text": "MM"}).json() == ["gamma"]
    assert client.get("/v1/tags/", {"name": "et"}).json() == ["beta"]
    assert client.get("/v1/tags/", {"query_text": "%"}).json() == []


def test_tags_paginate_with_after_until_an_empty_page(actor, api_client_for):
    AgentFactory(organization_id=actor.organization_id, tags=["a", "b", "c", "d", "e"])
    client = api_client_for(actor)

    seen, after = [], None
    for _ in range(10):
        page = client.get("/v1/tags/", {"limit": 2} | ({"after": after} if after else {})).json()
        if not page:
            break
        seen += page
        after = page[-1]

    assert seen == ["a", "b", "c", "d", "e"]
    assert client.get("/v1/tags/", {"before": "c"}).json() == ["a", "b"]


# --- tenancy and authentication, every endpoint ------------------------------------------------------------


@pytest.fixture
def victim(actor):
    """An agent of `actor`'s organisation with a tool and a spare block, for cross-organisation attempts."""
    tool = ToolFactory(organization_id=actor.organization_id, name="victim_tool")
    agent = make_agent(actor, name="Victim", include_base_tools=False, tool_ids=[tool.id], tags=["private"])
    spare = BlockFactory(organization_id=actor.organization_id, label="spare")
    return agent, tool, spare


AGENT_ENDPOINTS = [
    ("get", "/v1/agents/{agent}", None),
    ("patch", "/v1/agents/{agent}", {"name": "hacked", "tags": []}),
    ("delete", "/v1/agents/{agent}", None),
    ("get", "/v1/agents/{agent}/tools", None),
    ("patch", "/v1/agents/{agent}/tools/attach/{tool}", None),
    ("patch", "/v1/agents/{agent}/tools/detach/{tool}", None),
]


@pytest.mark.parametrize(("method", "path", "body"), AGENT_ENDPOINTS)
def test_another_organisation_gets_404_and_changes_nothing(
    actor, other_org_actor, api_client_for, victim, method, path, body
):
    agent, tool, _ = victim
    url = path.format(agent=agent.id, tool=tool.id)

    response = getattr(api_client_for(other_org_actor), method)(url, body, format="json")

    assert response.status_code == 404
    assert response.json()["detail"] == f"Agent with id '{agent.id}' not found"
    agent.refresh_from_db()
    assert (agent.name, agent.tags) == ("Victim", ["private"])
    assert list(agent.tools.values_list("id", flat=True)) == [tool.id]


def test_another_organisation_cannot_attach_its_tool_to_my_agent_or_mine_to_its(
    actor, other_org_actor, api_client_for, victim
):
    _, tool, _ = victim
    theirs = make_agent(other_org_actor, name="Theirs", include_base_tools=False)

    response = api_client_for(other_org_actor).patch(f"/v1/agents/{theirs.id}/tools/attach/{tool.id}")

    assert response.status_code == 404
    assert not AgentTool.objects.filter(agent=theirs).exists()


def test_another_organisation_sees_none_of_my_agents_or_tags(actor, other_org_actor, api_client_for, victim):
    client = api_client_for(other_org_actor)

    assert client.get("/v1/agents/").json() == []
    assert client.get("/v1/tags/").json() == []


ALL_ENDPOINTS = [
    ("get", "/v1/agents/"),
    ("post", "/v1/agents/"),
    ("get", "/v1/agents/{agent}"),
    ("patch", "/v1/agents/{agent}"),
    ("delete", "/v1/agents/{agent}"),
    ("get", "/v1/agents/{agent}/tools"),
    ("patch", "/v1/agents/{agent}/tools/attach/{tool}"),
    ("patch", "/v1/agents/{agent}/tools/detach/{tool}"),
    ("get", "/v1/agents/{agent}/core-memory/blocks"),
    ("get", "/v1/agents/{agent}/core-memory/blocks/human"),
    ("patch", "/v1/agents/{agent}/core-memory/blocks/human"),
    ("patch", "/v1/agents/{agent}/core-memory/blocks/attach/{block}"),
    ("patch", "/v1/agents/{agent}/core-memory/blocks/detach/{block}"),
    ("get", "/v1/tags/"),
    ("get", "/v1/models/"),
    ("get", "/v1/models/embedding"),
]


@pytest.mark.parametrize(("method", "path"), ALL_ENDPOINTS)
def test_every_endpoint_needs_a_key(actor, victim, method, path):
    agent, tool, spare = victim
    url = path.format(agent=agent.id, tool=tool.id, block=spare.id)

    response = getattr(APIClient(), method)(url, {"name": "x"}, format="json")

    assert response.status_code == 401
    assert "detail" in response.json()
    agent.refresh_from_db()
    assert agent.name == "Victim"
    assert Agent.objects.for_actor(actor).count() == 1


@pytest.mark.parametrize("path", ["/v1/agents", "/v1/agents/", "/v1/tags", "/v1/tags/"])
def test_both_slash_forms_are_served_without_redirect(actor, api_client_for, path):
    assert api_client_for(actor).get(path).status_code == 200


@pytest.mark.parametrize("path", ["/v1/agents/import", "/v1/agents/import/"])
def test_the_import_path_is_not_taken_for_an_agent_id(path):
    try:
        view_class = getattr(resolve(path).func, "view_class", None)
    except Resolver404:
        view_class = None

    assert view_class is not AgentDetailApi


def test_a_sleeptime_agents_primary_shows_its_sleeptime_group(actor, api_client_for):
    client = api_client_for(actor)
    agent = client.post(
        "/v1/agents/",
        {"name": "Main", "model": "openai/gpt-4o-mini", "enable_sleeptime": True},
        format="json",
    ).json()
    plain = client.post("/v1/agents/", {"name": "Plain", "model": "openai/gpt-4o-mini"}, format="json").json()
    sleeptime_id = Agent.objects.for_actor(actor).get(id=agent["id"]).sleeptime_agent_id

    group = agent["managed_group"]

    assert group["manager_type"] == "sleeptime"
    assert (group["manager_agent_id"], group["agent_ids"]) == (agent["id"], [sleeptime_id])
    assert agent["multi_agent_group"] == group
    shown = client.get(f"/v1/agents/{agent['id']}", {"include": "agent.managed_group"}).json()
    assert shown["managed_group"]["id"] == group["id"]
    assert (plain["managed_group"], plain["multi_agent_group"]) == (None, None)
