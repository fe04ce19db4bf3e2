"""The workspace's configuration column: fields saved through agent_update, tools, tool rules, sleeptime."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from apps.agents.models import Agent
from apps.agents.services import agent_create
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
def agent(actor: Actor) -> Agent:
    return agent_create(actor=actor, name="Configurable", model="openai/scripted-chat")


def fresh(agent: Agent) -> Agent:
    return Agent.all_objects.get(id=agent.id)


def url(agent: Agent, rest: str) -> str:
    return f"/agents/{agent.id}/config/{rest}"


# --- the column on the workspace page -------------------------------------------------------------------------


def test_workspace_page_renders_the_config_column(owner_client: Client, agent: Agent) -> None:
    response = owner_client.get(f"/agents/{agent.id}/")

    html = response.content.decode()
    assert response.status_code == 200
    assert 'data-testid="config-column"' in html
    assert 'value="Configurable"' in html
    assert "You are a helpful assistant with a persistent memory" in html  # the default prompt, shown
    assert 'data-tool-name="memory_insert"' in html


# --- fields -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "posted", "column", "expected"),
    [
        ("name", {"value": "Renamed agent"}, "name", "Renamed agent"),
        ("context_window_limit", {"value": "16000"}, "context_window_limit", 16000),
        ("context_window_limit", {"value": ""}, "context_window_limit", None),
        ("temperature", {"value": "0.2"}, "temperature", 0.2),
        ("system", {"value": "You are terse.\n"}, "system", "You are terse.\n"),
        (
            "embedding",
            {"embedding": "openai/text-embedding-3-small"},
            "embedding",
            "openai/text-embedding-3-small",
        ),
        (
            "model",
            {"model": "openai/scripted-chat", "model_other": "openai/gpt-4o"},
            "model",
            "openai/gpt-4o",
        ),
    ],
)
def test_each_field_saves_and_tells_the_memory_column(
    owner_client: Client, agent: Agent, llm: Any, key: str, posted: dict[str, str], column: str, expected: Any
) -> None:
    response = owner_client.post(url(agent, f"field/{key}/"), posted, **HTMX)

    assert response.status_code == 200
    assert json.loads(response["HX-Trigger"]) == {"ade:agent-changed": {}}
    assert "Saved ✓" in response.content.decode()
    assert getattr(fresh(agent), column) == expected


def test_temperature_keeps_the_provider_extras(owner_client: Client, actor: Actor, llm: Any) -> None:
    agent = agent_create(actor=actor, name="Extras", model="openai/scripted-chat")
    Agent.all_objects.filter(id=agent.id).update(model_settings={"reasoning_effort": "low"})

    owner_client.post(url(agent, "field/temperature/"), {"value": "1.1"}, **HTMX)

    assert fresh(agent).temperature == 1.1
    assert fresh(agent).model_settings == {"reasoning_effort": "low"}


@pytest.mark.parametrize(
    ("key", "posted", "message"),
    [
        ("name", {"value": "no/slashes"}, "Invalid agent name"),
        ("model", {"model": "", "model_other": "gpt-4o"}, "expected &#x27;provider/model-name&#x27;"),
        ("model", {"model": "", "model_other": "nosuch/model"}, "nosuch"),
        ("temperature", {"value": "hot"}, "Temperature must be a number between 0 and 2"),
        ("temperature", {"value": "3"}, "Temperature must be between 0 and 2"),
        ("context_window_limit", {"value": "lots"}, "must be a whole number of tokens"),
        ("context_window_limit", {"value": "0"}, "must be at least 1 token"),
    ],
)
def test_invalid_values_answer_422_with_the_message_and_change_nothing(
    owner_client: Client, agent: Agent, llm: Any, key: str, posted: dict[str, str], message: str
) -> None:
    before = fresh(agent)

    response = owner_client.post(url(agent, f"field/{key}/"), posted, **HTMX)

    assert response.status_code == 422
    assert message in response.content.decode()
    assert "HX-Trigger" not in response
    after = fresh(agent)
    assert (after.name, after.model, after.temperature, after.context_window_limit) == (
        before.name,
        before.model,
        before.temperature,
        before.context_window_limit,
    )


def test_model_picker_lists_the_providers_models(owner_client: Client, agent: Agent, llm: Any) -> None:
    response = owner_client.get(url(agent, "field/model/"), **HTMX)

    assert '<option value="openai/scripted-chat" selected>' in response.content.decode()


def test_unknown_field_is_not_found(owner_client: Client, agent: Agent) -> None:
    response = owner_client.post(url(agent, "field/tool_rules/"), {"value": "[]"}, **HTMX)

    assert response.status_code == 404


# --- tools --------------------------------------------------------------------------------------------------


def test_attach_and_detach_a_custom_tool(owner_client: Client, agent: Agent, actor: Actor) -> None:
    tool = tool_upsert(actor=actor, source_code=TOOL_SOURCE)

    attached = owner_client.post(url(agent, "tools/attach/"), {"tool": tool.id}, **HTMX)

    assert attached.status_code == 200
    assert json.loads(attached["HX-Trigger"]) == {"ade:agent-changed": {}}
    assert 'data-tool-name="lookup_order"' in attached.content.decode()
    assert fresh(agent).tools.filter(id=tool.id).exists()

    detached = owner_client.post(url(agent, f"tools/{tool.id}/detach/"), **HTMX)

    assert detached.status_code == 200
    assert 'data-tool-name="lookup_order"' not in detached.content.decode()
    assert not fresh(agent).tools.filter(id=tool.id).exists()


def test_attach_a_builtin_the_organisation_has_not_used_yet(owner_client: Client, agent: Agent) -> None:
    response = owner_client.post(
        url(agent, "tools/attach/"), {"tool": "builtin:archival_memory_search"}, **HTMX
    )

    assert response.status_code == 200
    assert fresh(agent).tools.filter(name="archival_memory_search").exists()


def test_attaching_nothing_or_another_orgs_tool_is_refused(
    owner_client: Client, agent: Agent, other_org_actor: Actor
) -> None:
    theirs = tool_upsert(actor=other_org_actor, source_code=TOOL_SOURCE)

    empty = owner_client.post(url(agent, "tools/attach/"), {"tool": ""}, **HTMX)
    foreign = owner_client.post(url(agent, "tools/attach/"), {"tool": theirs.id}, **HTMX)

    assert empty.status_code == 422
    assert "Choose a tool to attach." in empty.content.decode()
    assert foreign.status_code == 422
    assert f"Tool with id &#x27;{theirs.id}&#x27; not found" in foreign.content.decode()
    assert not fresh(agent).tools.filter(name="lookup_order").exists()


# --- tool rules ---------------------------------------------------------------------------------------------

RULE_POSTS = [
    ({"type": "run_first", "tool_name": "memory_insert", "args": '{"label": "human"}'},
     {"type": "run_first", "tool_name": "memory_insert", "args": {"label": "human"}}),
    ({"type": "exit_loop", "tool_name": "memory_replace"}, {"type": "exit_loop", "tool_name": "memory_replace"}),
    ({"type": "continue_loop", "tool_name": "memory_insert"},
     {"type": "continue_loop", "tool_name": "memory_insert"}),
    ({"type": "constrain_child_tools", "tool_name": "memory_insert", "children": ["memory_replace"],
      "children_other": "send_email, memory_replace"},
     {"type": "constrain_child_tools", "tool_name": "memory_insert", "children": ["memory_replace", "send_email"]}),
    ({"type": "parent_last_tool", "tool_name": "conversation_search", "children": ["memory_insert"]},
     {"type": "parent_last_tool", "tool_name": "conversation_search", "children": ["memory_insert"]}),
    ({"type": "conditional", "tool_name": "conversation_search", "mapping": "yes => memory_insert\nno=>memory_replace\n",
      "default_child": "memory_replace", "require_output_mapping": "on"},
     {"type": "conditional", "tool_name": "conversation_search",
      "child_output_mapping": {"yes": "memory_insert", "no": "memory_replace"},
      "default_child": "memory_replace", "require_output_mapping": True}),
    ({"type": "max_count_per_step", "tool_name": "conversation_search", "max_count_limit": "3"},
     {"type": "max_count_per_step", "tool_name": "conversation_search", "max_count_limit": 3}),
    ({"type": "required_before_exit", "tool_name": "memory_insert"},
     {"type": "required_before_exit", "tool_name": "memory_insert"}),
    ({"type": "requires_approval", "tool_name": "memory_replace"},
     {"type": "requires_approval", "tool_name": "memory_replace"}),
]  # fmt: skip


@pytest.mark.parametrize(("posted", "stored"), RULE_POSTS, ids=[p["type"] for p, _ in RULE_POSTS])
def test_every_rule_type_can_be_added(
    owner_client: Client, agent: Agent, posted: dict[str, Any], stored: dict[str, Any]
) -> None:
    form = owner_client.get(url(agent, f"rules/new/?type={posted['type']}"), **HTMX)
    assert form.status_code == 200
    assert 'data-testid="rule-form"' in form.content.decode()

    response = owner_client.post(url(agent, "rules/new/"), posted, **HTMX)

    assert response.status_code == 200
    assert json.loads(response["HX-Trigger"]) == {"ade:agent-changed": {}}
    assert 'data-testid="rule-item"' in response.content.decode()
    assert fresh(agent).tool_rules == [stored]


def test_rules_are_shown_in_plain_english(owner_client: Client, actor: Actor) -> None:
    agent = agent_create(
        actor=actor,
        name="Ruled",
        tool_rules=[{"type": "max_count_per_step", "tool_name": "x", "max_count_limit": 2}],
    )

    response = owner_client.get(url(agent, "rules/"), **HTMX)

    assert "You may call x at most 2 time(s) per response." in response.content.decode()


def test_edit_a_rule_in_place(owner_client: Client, actor: Actor) -> None:
    rules = [
        {"type": "exit_loop", "tool_name": "memory_replace"},
        {"type": "max_count_per_step", "tool_name": "conversation_search", "max_count_limit": 2},
    ]
    agent = agent_create(actor=actor, name="Ruled", tool_rules=rules)
    form = owner_client.get(url(agent, "rules/1/"), **HTMX)
    assert 'value="2"' in form.content.decode()

    response = owner_client.post(
        url(agent, "rules/1/"),
        {
            "type": "max_count_per_step",
            "tool_name": "conversation_search",
            "max_count_limit": "5",
            "original": '{"max_count_limit": 2, "tool_name": "conversation_search", "type": "max_count_per_step"}',
        },
        **HTMX,
    )

    assert response.status_code == 200
    assert fresh(agent).tool_rules == [rules[0], {**rules[1], "max_count_limit": 5}]


def test_editing_a_rule_that_changed_meanwhile_is_refused(owner_client: Client, actor: Actor) -> None:
    rules = [{"type": "exit_loop", "tool_name": "memory_replace"}]
    agent = agent_create(actor=actor, name="Ruled", tool_rules=rules)

    response = owner_client.post(
        url(agent, "rules/0/"),
        {
            "type": "exit_loop",
            "tool_name": "other",
            "original": '{"tool_name": "stale", "type": "exit_loop"}',
        },
        **HTMX,
    )

    assert response.status_code == 422
    assert "changed since this form opened" in response.content.decode()
    assert fresh(agent).tool_rules == rules


def test_remove_a_rule(owner_client: Client, actor: Actor) -> None:
    rules = [{"type": "exit_loop", "tool_name": "a"}, {"type": "requires_approval", "tool_name": "b"}]
    agent = agent_create(actor=actor, name="Ruled", tool_rules=rules)

    response = owner_client.post(url(agent, "rules/0/delete/"), **HTMX)

    assert response.status_code == 200
    assert json.loads(response["HX-Trigger"]) == {"ade:agent-changed": {}}
    assert fresh(agent).tool_rules == [rules[1]]


@pytest.mark.parametrize(
    ("posted", "message"),
    [
        ({"type": "max_count_per_step", "tool_name": "x", "max_count_limit": "0"},
         "This rule (max_count_per_step): &#x27;max_count_limit&#x27; must be at least 1"),
        ({"type": "exit_loop", "tool_name": "  "}, "&#x27;tool_name&#x27; must not be empty"),
        ({"type": "constrain_child_tools", "tool_name": "x"}, "&#x27;children&#x27; must not be empty"),
        ({"type": "conditional", "tool_name": "x", "mapping": "yes send"}, "write it as &#x27;output =&gt; tool_name&#x27;"),
        ({"type": "run_first", "tool_name": "x", "args": "{nope"}, "Arguments must be a JSON object"),
        ({"type": "continue_loop", "tool_name": "memory_replace"}, "cannot be both exit_loop"),
        ({"type": "teleport", "tool_name": "x"}, "Unknown rule type &#x27;teleport&#x27;"),
    ],
)  # fmt: skip
def test_invalid_rules_are_refused_with_the_rules_message(
    owner_client: Client, actor: Actor, posted: dict[str, str], message: str
) -> None:
    rules = [{"type": "exit_loop", "tool_name": "memory_replace"}]
    agent = agent_create(actor=actor, name="Ruled", tool_rules=rules)

    response = owner_client.post(url(agent, "rules/new/"), posted, **HTMX)

    assert response.status_code == 422
    assert response["HX-Retarget"] == "#rule-form"
    assert message in response.content.decode()
    assert fresh(agent).tool_rules == rules


# --- sleeptime ----------------------------------------------------------------------------------------------


def test_turn_sleeptime_on_with_a_frequency_then_off(owner_client: Client, agent: Agent) -> None:
    on = owner_client.post(url(agent, "sleeptime/"), {"enabled": "on", "frequency": "3"}, **HTMX)

    assert on.status_code == 200
    assert json.loads(on["HX-Trigger"]) == {"ade:agent-changed": {}}
    assert (fresh(agent).enable_sleeptime, fresh(agent).sleeptime_agent_frequency) == (True, 3)
    assert fresh(agent).sleeptime_agent is not None
    assert "Open the sleeptime agent" in on.content.decode()

    off = owner_client.post(url(agent, "sleeptime/"), {"frequency": "3"}, **HTMX)

    assert off.status_code == 200
    assert (fresh(agent).enable_sleeptime, fresh(agent).sleeptime_agent_id) == (False, None)


@pytest.mark.parametrize(("frequency", "message"), [("0", "between 1 and 1000"), ("often", "whole number")])
def test_bad_sleeptime_frequency_is_refused(
    owner_client: Client, agent: Agent, frequency: str, message: str
) -> None:
    response = owner_client.post(url(agent, "sleeptime/"), {"enabled": "on", "frequency": frequency}, **HTMX)

    assert response.status_code == 422
    assert message in response.content.decode()
    assert fresh(agent).enable_sleeptime is False


# --- tenancy and roles --------------------------------------------------------------------------------------

FOREIGN = [
    ("get", "field/name/", {}),
    ("post", "field/name/", {"value": "Hijacked"}),
    ("post", "field/system/", {"value": "Hijacked"}),
    ("get", "tools/", {}),
    ("post", "tools/attach/", {"tool": "builtin:send_message"}),
    ("post", "tools/tool-x/detach/", {}),
    ("get", "rules/", {}),
    ("get", "rules/new/?type=exit_loop", {}),
    ("post", "rules/new/", {"type": "exit_loop", "tool_name": "x"}),
    ("get", "rules/0/", {}),
    ("post", "rules/0/", {"type": "exit_loop", "tool_name": "x"}),
    ("post", "rules/0/delete/", {}),
    ("get", "sleeptime/", {}),
    ("post", "sleeptime/", {"enabled": "on", "frequency": "2"}),
]


@pytest.mark.parametrize(("method", "rest", "data"), FOREIGN, ids=[f"{m} {r}" for m, r, _ in FOREIGN])
def test_another_organisations_agent_is_not_found(
    owner_client: Client, other_org_actor: Actor, method: str, rest: str, data: dict[str, str]
) -> None:
    theirs = agent_create(
        actor=other_org_actor, name="Theirs", tool_rules=[{"type": "exit_loop", "tool_name": "send_message"}]
    )

    response = getattr(owner_client, method)(url(theirs, rest), data, **HTMX)

    assert response.status_code == 404
    after = fresh(theirs)
    assert (after.name, after.system, after.tool_rules, after.enable_sleeptime) == (
        "Theirs",
        "",
        [{"type": "exit_loop", "tool_name": "send_message"}],
        False,
    )


def test_a_member_configures_only_the_agents_they_created(
    client: Client, org: Any, make_user: Any, agent: Agent
) -> None:
    member = make_user(org)
    client.force_login(member)
    own = agent_create(
        actor=Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER),
        name="Mine",
        model="openai/gpt-4o-mini",
    )

    theirs = client.post(url(agent, "field/system/"), {"value": "Members edit prompts."}, **HTMX)
    mine = client.post(url(own, "field/system/"), {"value": "My prompt."}, **HTMX)

    assert theirs.status_code == 403
    assert "only its creator, an owner or an admin may modify an agent" in theirs.content.decode()
    assert fresh(agent).system != "Members edit prompts."
    assert (mine.status_code, fresh(own).system) == (200, "My prompt.")
