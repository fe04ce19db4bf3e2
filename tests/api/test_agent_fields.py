"""Every field of Letta 0.16.7's CreateAgent and UpdateAgent, sent alone: honoured (its effect is visible
on the agent) or refused with a 422 that names it. None may be dropped silently."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from apps.agents.models import Agent, AgentSecret, Message
from apps.api.serializers.agents import CREATE_UNSUPPORTED, NO_LONGER_USED, UPDATE_UNSUPPORTED
from apps.identities.services import identity_create
from apps.memory.models import Block
from apps.tools.services import tool_upsert
from tests.api.test_role_matrix import ADD

BASE = {"name": "fields", "model": "openai/gpt-4o-mini", "include_base_tools": False}

Check = Callable[[Agent], bool]


def _file_limits(agent: Agent) -> Any:
    from apps.folders.selectors import agent_file_limits

    return agent_file_limits(agent)


def _stored(agent: Agent) -> Agent:
    return Agent.objects.unscoped().get(id=agent.id)


def _messages(agent: Agent) -> list[tuple[str, str]]:
    rows = {m.id: m for m in Message.objects.unscoped().filter(id__in=agent.message_ids)}
    return [(rows[i].role, rows[i].text) for i in agent.message_ids]


# field -> (value, check of the created agent); `None` check: the field has no visible effect (Letta's
# "Deprecated: No longer used").
HONOURED_ON_CREATE: dict[str, tuple[Any, Check | None]] = {
    "name": ("named", lambda a: a.name == "named"),
    "memory_blocks": (
        [{"label": "human", "value": "Sam"}],
        lambda a: list(a.blocks.values_list("label", flat=True)) == ["human"],
    ),
    "tools": (["send_message"], lambda a: list(a.tools.values_list("name", flat=True)) == ["send_message"]),
    "tags": (["x", "y"], lambda a: a.tags == ["x", "y"]),
    "system": ("Be brief.", lambda a: a.system == "Be brief."),
    "agent_type": ("memgpt_v2_agent", lambda a: a.agent_type == "memgpt_v2_agent"),
    "initial_message_sequence": (
        [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}],
        lambda a: _messages(a) == [("user", "hello"), ("assistant", "hi there")],
    ),
    "include_base_tools": (True, lambda a: a.tools.exists()),
    "include_multi_agent_tools": (
        True,
        lambda a: (
            sorted(a.tools.values_list("name", flat=True))
            == [
                "send_message_to_agent_and_wait_for_reply",
                "send_message_to_agent_async",
                "send_message_to_agents_matching_tags",
            ]
        ),
    ),
    "include_base_tool_rules": (True, lambda a: a.tool_rules != []),
    "description": ("about", lambda a: a.description == "about"),
    "metadata": ({"k": "v"}, lambda a: a.metadata == {"k": "v"}),
    "llm_config": (
        {"model": "gpt-4o", "model_endpoint_type": "openai", "context_window": 64000},
        lambda a: (a.model, a.context_window_limit) == ("openai/gpt-4o", 64000),
    ),
    "embedding_config": (
        {
            "embedding_model": "text-embedding-3-small",
            "embedding_endpoint_type": "openai",
            "embedding_dim": 1536,
        },
        lambda a: a.embedding == "openai/text-embedding-3-small",
    ),
    "model": ("openai/gpt-4o", lambda a: a.model == "openai/gpt-4o"),
    "embedding": ("openai/text-embedding-3-small", lambda a: a.embedding == "openai/text-embedding-3-small"),
    "model_settings": ({"temperature": 0.2}, lambda a: a.temperature == 0.2),
    "compaction_settings": ({"sliding_window_percentage": 0.3}, lambda a: bool(a.compaction_settings)),
    "context_window_limit": (32000, lambda a: a.context_window_limit == 32000),
    "max_tokens": (512, lambda a: a.max_tokens == 512),
    "tool_exec_environment_variables": (
        {"K": "v"},
        lambda a: AgentSecret.objects.unscoped().filter(agent=a, key="K").exists(),
    ),
    "secrets": ({"S": "v"}, lambda a: AgentSecret.objects.unscoped().filter(agent=a, key="S").exists()),
    "message_buffer_autoclear": (True, lambda a: a.message_buffer_autoclear),
    "enable_sleeptime": (True, lambda a: a.sleeptime_agent_id is not None),
    "response_format": (
        {"type": "json_object"},
        lambda a: a.model_settings.get("response_format") == {"type": "json_object"},
    ),
    "timezone": ("Europe/Paris", lambda a: a.timezone == "Europe/Paris"),
    "hidden": (True, lambda a: a.hidden),
    "parallel_tool_calls": (True, lambda a: a.parallel_tool_calls),
    "max_files_open": (3, lambda a: _file_limits(a).max_files_open == 3),
    "per_file_view_window_char_limit": (1000, lambda a: _file_limits(a).per_file_char_limit == 1000),
    **{name: ("anything" if name != "embedding_chunk_size" else 300, None) for name in NO_LONGER_USED},
}
FOLDER_FIELDS = {"folder_ids", "source_ids", "include_default_source"}
BODY_FOR = {  # what else a field needs to show its effect
    "llm_config": {"model": None},  # an explicit handle would win
    "include_base_tool_rules": {"include_base_tools": True},  # rules for the base tools
}
REFUSED_VALUES: dict[str, Any] = {
    "from_template": "t",
    "template": True,
    "project": "p",
    "memory_variables": {"a": "b"},
    "reasoning": True,
    "enable_reasoner": True,
    "max_reasoning_tokens": 100,
}
LETTA_CREATE_FIELDS = {  # letta/schemas/agent.py CreateAgent, tag 0.16.7
    "name", "memory_blocks", "tools", "tool_ids", "source_ids", "folder_ids", "block_ids", "tool_rules",
    "tags", "system", "agent_type", "initial_message_sequence", "include_base_tools",
    "include_multi_agent_tools", "include_base_tool_rules", "include_default_source", "description",
    "metadata", "llm_config", "embedding_config", "model", "embedding", "model_settings",
    "compaction_settings", "context_window_limit", "embedding_chunk_size", "max_tokens",
    "max_reasoning_tokens", "enable_reasoner", "reasoning", "from_template", "template", "project",
    "tool_exec_environment_variables", "secrets", "memory_variables", "project_id", "template_id",
    "base_template_id", "identity_ids", "message_buffer_autoclear", "enable_sleeptime", "response_format",
    "timezone", "max_files_open", "per_file_view_window_char_limit", "hidden", "parallel_tool_calls",
}  # fmt: skip


@pytest.fixture
def owned(actor) -> dict[str, str]:
    """Ids for the fields that name existing objects."""
    tool = tool_upsert(actor=actor, source_code=ADD)
    block = Block.objects.for_actor(actor).create(label="shared", value="v", limit=100)
    identity = identity_create(actor=actor, identifier_key="user-7", name="Sam", identity_type="user")
    return {"tool": tool.id, "block": block.id, "identity": identity.id}


def test_every_documented_create_field_is_covered() -> None:
    named_ids = {"tool_ids", "block_ids", "tool_rules", "identity_ids"}  # test_ids_and_rules_at_creation...
    covered = set(HONOURED_ON_CREATE) | set(CREATE_UNSUPPORTED) | named_ids
    covered |= FOLDER_FIELDS  # they name folders: test_folders_at_creation_are_honoured
    assert covered == LETTA_CREATE_FIELDS
    assert set(REFUSED_VALUES) == set(CREATE_UNSUPPORTED)


@pytest.mark.parametrize("field", sorted(HONOURED_ON_CREATE))
def test_a_create_field_is_honoured(field: str, actor, api_client_for) -> None:
    value, check = HONOURED_ON_CREATE[field]
    body = {**BASE, **BODY_FOR.get(field, {}), field: value}
    response = api_client_for(actor).post("/v1/agents/", body, format="json")

    assert response.status_code == 200, response.content
    if check is not None:
        assert check(_stored(Agent(id=response.json()["id"])))


def test_ids_and_rules_at_creation_are_honoured(actor, api_client_for, owned) -> None:
    body = {
        **BASE,
        "tool_ids": [owned["tool"]],
        "block_ids": [owned["block"]],
        "tool_rules": [{"type": "max_count_per_step", "tool_name": "add", "max_count_limit": 2}],
        "identity_ids": [owned["identity"]],
    }

    response = api_client_for(actor).post("/v1/agents/", body, format="json")

    agent = _stored(Agent(id=response.json()["id"]))
    assert list(agent.tools.values_list("id", flat=True)) == [owned["tool"]]
    assert list(agent.blocks.values_list("id", flat=True)) == [owned["block"]]
    assert agent.tool_rules[0]["tool_name"] == "add"
    assert response.json()["identity_ids"] == [owned["identity"]]


def test_identity_ids_on_update_are_the_agents_set_and_unknown_ones_change_nothing(
    actor, api_client_for, owned
):
    client = api_client_for(actor)
    agent = client.post("/v1/agents/", {**BASE, "identity_ids": [owned["identity"]]}, format="json").json()

    unknown = client.patch(f"/v1/agents/{agent['id']}", {"identity_ids": ["identity-nope"]}, format="json")
    cleared = client.patch(f"/v1/agents/{agent['id']}", {"identity_ids": []}, format="json")

    assert unknown.status_code == 404
    assert cleared.json()["identity_ids"] == []


@pytest.mark.parametrize("field", sorted(REFUSED_VALUES))
def test_a_create_field_this_server_lacks_is_refused_by_name(field: str, actor, api_client_for) -> None:
    response = api_client_for(actor).post(
        "/v1/agents/", {**BASE, field: REFUSED_VALUES[field]}, format="json"
    )

    assert response.status_code == 422
    assert response.json()["detail"].startswith(f"{field}: not supported")
    assert not Agent.objects.for_actor(actor).exists()


@pytest.mark.parametrize("field", sorted(REFUSED_VALUES))
def test_a_refused_field_sent_empty_is_no_request_for_it(field: str, actor, api_client_for) -> None:
    empty = {list: [], bool: False, dict: {}}.get(type(REFUSED_VALUES[field]))
    response = api_client_for(actor).post("/v1/agents/", {**BASE, field: empty}, format="json")

    assert response.status_code == 200, response.content


@pytest.mark.parametrize("field", sorted(UPDATE_UNSUPPORTED))
def test_an_update_field_this_server_lacks_is_refused_by_name(field: str, actor, api_client_for) -> None:
    client = api_client_for(actor)
    agent = client.post("/v1/agents/", BASE, format="json").json()

    response = client.patch(f"/v1/agents/{agent['id']}", {field: REFUSED_VALUES[field]}, format="json")

    assert response.status_code == 422
    assert response.json()["detail"].startswith(f"{field}: not supported")


def test_an_old_clients_llm_config_without_a_handle_gives_a_runnable_model(actor, api_client_for) -> None:
    client = api_client_for(actor)
    agent = client.post("/v1/agents/", {"name": "old"}, format="json").json()

    response = client.patch(
        f"/v1/agents/{agent['id']}",
        {"llm_config": {"model": "gpt-4o-mini", "model_endpoint_type": "openai", "context_window": 8000}},
        format="json",
    )

    assert response.status_code == 200, response.content
    assert (response.json()["model"], response.json()["context_window_limit"]) == ("openai/gpt-4o-mini", 8000)


def test_the_initial_sequence_is_listed_first_and_empty_means_empty(actor, api_client_for) -> None:
    client = api_client_for(actor)
    sequence = [{"role": "system", "content": "Session start"}, {"role": "user", "content": "hi"}]
    with_sequence = client.post("/v1/agents/", {**BASE, "initial_message_sequence": sequence}, format="json")
    without = client.post("/v1/agents/", {**BASE, "initial_message_sequence": []}, format="json")

    listed = client.get(f"/v1/agents/{with_sequence.json()['id']}/messages", {"order": "asc"}).json()
    assert [m.get("content") for m in listed if m["message_type"] == "user_message"] == ["hi"]
    assert _stored(Agent(id=without.json()["id"])).message_ids == []


def test_a_bad_message_in_the_initial_sequence_is_a_422_naming_it(actor, api_client_for) -> None:
    body = {**BASE, "initial_message_sequence": [{"role": "user", "content": "ok"}, {"role": "tool"}]}

    response = api_client_for(actor).post("/v1/agents/", body, format="json")

    assert response.status_code == 422
    assert "initial_message_sequence[1]" in response.json()["detail"]
    assert not Agent.objects.for_actor(actor).exists()


def test_folders_at_creation_are_honoured(actor, api_client_for, llm) -> None:
    from apps.folders.selectors import attached_folders
    from apps.folders.services import folder_create

    first = folder_create(actor=actor, name="first", embedding_handle="openai/text-embedding-small-384")
    second = folder_create(actor=actor, name="second", embedding_handle="openai/text-embedding-small-384")
    body = {
        **BASE,
        "embedding": "openai/text-embedding-small-384",
        "folder_ids": [first.id],
        "source_ids": [second.id],
        "include_default_source": True,
    }

    response = api_client_for(actor).post("/v1/agents/", body, format="json")

    assert response.status_code == 200, response.content
    names = [f.name for f in attached_folders(actor=actor, agent_id=response.json()["id"])]
    assert names == ["first", "second", "fields External Data Source"]
