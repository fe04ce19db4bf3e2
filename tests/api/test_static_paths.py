"""Static /v1 paths that an id route used to take (counts, active runs, add-base-tools, generate-schema,
the MCP resync), the routes added beside them (a block's agents, running an agent's tool, a run's trace),
JSON answers for unknown paths, wrong methods and Letta Cloud's features (/v1/health and /v1/ready:
tests/api/test_ready.py)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from apps.agents.models import Run
from apps.agents.services import BlockSpec, agent_create
from apps.core.actor import Actor, Role
from apps.memory.models import Block
from apps.memory.services import block_attach_to_agent
from apps.tools.builtin import BUILTIN_TOOLS, SERVER_TOOLS
from apps.tools.mcp import mcp_tool_register
from apps.tools.models import Tool
from apps.tools.services import tool_upsert
from tests.api.test_mcp_api import _outbound, _stdio_allowed, stdio_server  # noqa: F401 (autouse fixtures)
from tests.factories import AgentFactory, BlockFactory, ToolFactory

MISSING_RUN = "run-00000000-0000-4000-8000-000000000000"

GREET_SOURCE = '''
def greet(name: str) -> str:
    """Greet someone by name.

    Args:
        name (str): Who to greet.
    """
    import os
    print("greeting", name)
    return f"{os.environ.get('GREETING', 'Hello')}, {name}!"
'''

FAIL_SOURCE = '''
def explode(why: str) -> str:
    """Always fails.

    Args:
        why (str): The reason given.
    """
    raise RuntimeError("boom: " + why)
'''

LETTA_TOOL_SET = {
    "send_message",
    "conversation_search",
    "archival_memory_insert",
    "archival_memory_search",
    "core_memory_append",
    "core_memory_replace",
    "memory",
    "memory_apply_patch",
    "send_message_to_agent_and_wait_for_reply",
    "send_message_to_agents_matching_tags",
    "send_message_to_agent_async",
    "memory_replace",
    "memory_insert",
    "memory_rethink",
    "memory_finish_edits",
    "store_memories",
    "rethink_user_memory",
    "finish_rethinking_memory",
    "search_memory",
    "run_code",
    "run_code_with_tools",
    "web_search",
    "fetch_webpage",
    "open_files",
    "grep_files",
    "semantic_search_files",
}
"""letta/constants.py LETTA_TOOL_SET at 0.16.7."""
BUILTIN_SET = LETTA_TOOL_SET | SERVER_TOOLS  # and this server's own built-ins (load_skill)


def new_agent(actor, **kwargs):
    kwargs.setdefault("name", "Assistant")
    kwargs.setdefault("model", "openai/gpt-4o-mini")
    kwargs.setdefault("memory_blocks", [BlockSpec(label="human", value="Name: Sam", limit=200)])
    return agent_create(actor=actor, **kwargs)


# --- counts ---------------------------------------------------------------------------------------------


def test_agents_count_applies_the_list_filters(actor, other_org_actor, api_client_for):
    AgentFactory(organization_id=actor.organization_id, tags=["support"])
    AgentFactory(organization_id=actor.organization_id, tags=["support", "vip"])
    AgentFactory(organization_id=actor.organization_id, name="Sales")
    AgentFactory(organization_id=other_org_actor.organization_id, tags=["support"])
    client = api_client_for(actor)

    every = client.get("/v1/agents/count")
    tagged = client.get("/v1/agents/count", {"tags": ["support", "vip"], "match_all_tags": "true"})
    named = client.get("/v1/agents/count/", {"name": "Sales"})

    assert (every.status_code, every.json()) == (200, 3)
    assert (tagged.json(), named.json()) == (1, 1)


def test_blocks_count_applies_the_list_filters(actor, other_org_actor, api_client_for):
    BlockFactory(organization_id=actor.organization_id, label="human", tags=["a"])
    BlockFactory(organization_id=actor.organization_id, label="human")
    BlockFactory(organization_id=actor.organization_id, label="persona", is_template=True, template_name="p1")
    BlockFactory(organization_id=other_org_actor.organization_id, label="human")
    client = api_client_for(actor)

    assert client.get("/v1/blocks/count").json() == 3
    assert client.get("/v1/blocks/count", {"label": "human"}).json() == 2
    assert client.get("/v1/blocks/count", {"templates_only": "true", "name": "p1"}).json() == 1
    assert client.get("/v1/blocks/count", {"tags": "a"}).json() == 1


def test_tools_count_applies_the_list_filters(actor, api_client_for):
    client = api_client_for(actor)
    client.get("/v1/tools/")  # the base tools, as a first listing creates them
    ToolFactory(organization_id=actor.organization_id, name="mine")
    ToolFactory(organization_id=actor.organization_id, name="yours")

    assert client.get("/v1/tools/count").json() == len(BUILTIN_SET) + 2
    assert client.get("/v1/tools/count", {"exclude_letta_tools": "true"}).json() == 2
    assert client.get("/v1/tools/count", {"return_only_letta_tools": "true"}).json() == len(BUILTIN_SET)
    assert client.get("/v1/tools/count", {"names": ["mine", "memory"]}).json() == 2
    assert client.get("/v1/tools/count", {"tool_types": "bogus"}).status_code == 400


def test_counts_need_a_key():
    assert APIClient().get("/v1/agents/count").status_code == 401


# --- runs -----------------------------------------------------------------------------------------------


def test_active_runs_lists_created_and_running_runs_only(actor, other_org_actor, api_client_for):
    agent = AgentFactory(organization_id=actor.organization_id)
    other = AgentFactory(organization_id=actor.organization_id)
    running = Run.all_objects.create(organization_id=actor.organization_id, agent=agent, status="running")
    created = Run.all_objects.create(organization_id=actor.organization_id, agent=other, status="created")
    Run.all_objects.create(organization_id=actor.organization_id, agent=agent, status="completed")
    foreign = AgentFactory(organization_id=other_org_actor.organization_id)
    Run.all_objects.create(organization_id=other_org_actor.organization_id, agent=foreign, status="running")
    client = api_client_for(actor)

    every = client.get("/v1/runs/active")
    for_agent = client.get("/v1/runs/active/", {"agent_id": agent.id})

    assert every.status_code == 200
    assert sorted(run["id"] for run in every.json()) == sorted([running.id, created.id])
    assert [run["id"] for run in for_agent.json()] == [running.id]


def test_a_runs_trace_is_an_empty_span_list(actor, other_org_actor, api_client_for):
    run = Run.all_objects.create(
        organization_id=actor.organization_id, agent=AgentFactory(organization_id=actor.organization_id)
    )

    mine = api_client_for(actor).get(f"/v1/runs/{run.id}/trace", {"limit": 10})
    theirs = api_client_for(other_org_actor).get(f"/v1/runs/{run.id}/trace")
    missing = api_client_for(actor).get(f"/v1/runs/{MISSING_RUN}/trace")
    too_many = api_client_for(actor).get(f"/v1/runs/{run.id}/trace", {"limit": 5001})

    assert (mine.status_code, mine.json()) == (200, [])
    assert (theirs.status_code, missing.status_code) == (404, 404)
    assert too_many.status_code == 422
    assert "limit" in too_many.json()["detail"]


# --- tools: base tools, schema generation, MCP resync -----------------------------------------------------


def test_add_base_tools_creates_lettas_whole_base_tool_set_once(actor, api_client_for):
    client = api_client_for(actor)

    first = client.post("/v1/tools/add-base-tools")
    second = client.post("/v1/tools/add-base-tools/")

    assert first.status_code == 200
    assert {tool["name"] for tool in first.json()} == BUILTIN_SET
    assert [tool["id"] for tool in second.json()] == [tool["id"] for tool in first.json()]
    assert Tool.objects.for_actor(actor).count() == len(BUILTIN_SET)
    by_name = {tool["name"]: tool for tool in first.json()}
    assert by_name["web_search"]["tool_type"] == "letta_builtin"
    assert by_name["open_files"]["tool_type"] == "letta_files_core"
    assert by_name["store_memories"]["tool_type"] == "letta_voice_sleeptime_core"
    assert by_name["send_message_to_agent_async"]["tool_type"] == "letta_multi_agent_core"


def test_generate_schema_reads_the_source_without_storing_a_tool(actor, api_client_for):
    response = api_client_for(actor).post("/v1/tools/generate-schema", {"code": GREET_SOURCE}, format="json")

    assert response.status_code == 200
    assert response.json() == {
        "name": "greet",
        "description": "Greet someone by name.",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string", "description": "Who to greet."}},
            "required": ["name"],
        },
    }
    assert not Tool.objects.for_actor(actor).exists()


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (
            {"code": GREET_SOURCE.replace("        name (str): Who to greet.\n", "")},
            "parameter 'name' of tool 'greet' is not described in the docstring's Args section",
        ),
        (
            {"code": "function greet(name) {}", "source_type": "typescript"},
            "schemas are generated from Python source only; a typescript tool gives its json_schema",
        ),
    ],
)
def test_generate_schema_refuses_what_it_cannot_read(actor, api_client_for, body, detail):
    response = api_client_for(actor).post("/v1/tools/generate-schema", body, format="json")

    assert response.status_code == 400
    assert response.json()["detail"] == detail


def test_resync_updates_the_servers_tools_and_registers_no_tool_called_resync(actor, api_client_for):
    server = stdio_server(actor)
    mcp_tool_register(actor=actor, server=server, tool_name="add")

    response = api_client_for(actor).post("/v1/tools/mcp/servers/local/resync")

    assert response.status_code == 200
    assert response.json()["added"] == ["fail", "env_value", "auth_seen", "nap", "jail_probe"]
    assert (response.json()["unchanged"], response.json()["deleted"]) == (["add"], [])
    assert not Tool.objects.for_actor(actor).filter(name="resync").exists()
    assert Tool.objects.for_actor(actor).filter(tool_type="external_mcp").count() == 6


def test_resync_of_an_unknown_server_is_404(actor, api_client_for):
    response = api_client_for(actor).post("/v1/tools/mcp/servers/nowhere/resync")

    assert response.status_code == 404
    assert response.json()["detail"] == "MCP server 'nowhere' not found"


# --- a block's agents -----------------------------------------------------------------------------------


def test_a_blocks_agents_are_listed(actor, other_org_actor, api_client_for):
    block = BlockFactory(organization_id=actor.organization_id, label="shared")
    first, second = new_agent(actor, name="First"), new_agent(actor, name="Second")
    new_agent(actor, name="Unrelated")
    for agent in (first, second):
        block_attach_to_agent(actor=actor, agent_id=agent.id, block=block)

    response = api_client_for(actor).get(f"/v1/blocks/{block.id}/agents", {"order": "asc"})
    theirs = api_client_for(other_org_actor).get(f"/v1/blocks/{block.id}/agents")

    assert response.status_code == 200
    assert [agent["name"] for agent in response.json()] == ["First", "Second"]
    assert theirs.status_code == 404
    assert theirs.json()["detail"] == f"Block with id '{block.id}' not found"


# --- running an agent's tool ----------------------------------------------------------------------------


def run_url(agent, tool_name: str) -> str:
    return f"/v1/agents/{agent.id}/tools/{tool_name}/run"


def test_running_an_agents_tool_uses_its_secrets_in_the_sandbox(actor, api_client_for, settings):
    settings.SANDBOX_BACKEND = "local"
    tool = tool_upsert(actor=actor, source_code=GREET_SOURCE)
    agent = new_agent(actor, tool_ids=[tool.id], secrets_={"GREETING": "Hi"})

    response = api_client_for(actor).post(run_url(agent, "greet"), {"args": {"name": "Ann"}}, format="json")

    assert response.status_code == 200
    assert response.json() == {
        "status": "success",
        "func_return": "Hi, Ann!",
        "stdout": ["greeting Ann"],
        "stderr": [],
        "agent_state": None,
        "sandbox_config_fingerprint": None,
        "sandbox": "local",
    }


def test_running_a_memory_tool_edits_the_agents_memory(actor, api_client_for):
    agent = new_agent(actor)

    response = api_client_for(actor).post(
        run_url(agent, "memory_insert"),
        {"args": {"label": "human", "new_string": "Likes tea"}},
        format="json",
    )

    assert (response.status_code, response.json()["status"]) == (200, "success")
    assert Block.objects.for_actor(actor).get(label="human").value == "Name: Sam\nLikes tea"


def test_a_failing_tool_answers_no_return_and_says_why_in_stderr(actor, api_client_for, settings):
    settings.SANDBOX_BACKEND = "local"
    tool = tool_upsert(actor=actor, source_code=FAIL_SOURCE)
    agent = new_agent(actor, tool_ids=[tool.id])

    response = api_client_for(actor).post(run_url(agent, "explode"), {"args": {"why": "x"}}, format="json")

    body = response.json()
    assert (response.status_code, body["status"], body["func_return"]) == (200, "error", None)
    assert body["stderr"][-1].startswith("Error executing tool explode:")
    assert "RuntimeError: boom: x" in body["stderr"][-1]


def test_running_a_tool_the_agent_does_not_have_is_404(actor, api_client_for):
    ToolFactory(organization_id=actor.organization_id, name="elsewhere")
    agent = new_agent(actor)

    response = api_client_for(actor).post(run_url(agent, "elsewhere"), {"args": {}}, format="json")

    assert response.status_code == 404
    assert response.json()["detail"] == f"Tool 'elsewhere' not found or not attached to agent '{agent.id}'"


def test_only_those_who_configure_the_agent_may_run_its_tools(actor, org, make_user, api_client_for):
    agent = new_agent(actor)
    member = make_user(org, role=Role.MEMBER)
    member_actor = Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER)

    response = api_client_for(member_actor).post(
        run_url(agent, "memory_insert"), {"args": {"label": "human", "new_string": "Hacked"}}, format="json"
    )

    assert response.status_code == 403
    assert Block.objects.for_actor(actor).get(label="human").value == "Name: Sam"


def test_another_organisation_cannot_run_an_agents_tool(actor, other_org_actor, api_client_for):
    agent = new_agent(actor)

    response = api_client_for(other_org_actor).post(
        run_url(agent, "memory_insert"), {"args": {"label": "human", "new_string": "Hacked"}}, format="json"
    )

    assert response.status_code == 404
    assert response.json()["detail"] == f"Agent with id '{agent.id}' not found"
    assert Block.objects.for_actor(actor).get(label="human").value == "Name: Sam"


# --- JSON for unknown paths, wrong methods and Letta Cloud's features -------------------------------------


@pytest.mark.parametrize("method", ["get", "post", "delete"])
@pytest.mark.parametrize("path", ["/v1/no-such-thing", "/v1/agents/a/b/c/d/e", "/v1", "/v1/"])
def test_an_unknown_v1_path_is_a_json_404(db, method, path):
    response = getattr(APIClient(), method)(path)

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Not Found"}


def test_a_method_a_route_does_not_take_is_a_json_405(actor, api_client_for):
    response = api_client_for(actor).delete("/v1/tools/search")

    assert response.status_code == 405
    assert response.json() == {"detail": "Method Not Allowed"}
    assert "POST" in response["Allow"]


@pytest.mark.parametrize(
    ("method", "path", "feature"),
    [
        ("get", "/v1/templates", "Templates"),
        ("post", "/v1/templates/my-template/save", "Templates"),
        ("post", "/v1/templates/my-template:1/agents", "Templates"),
        ("get", "/v1/agents/agent-1/schedule", "Scheduled messages"),
        ("delete", "/v1/agents/agent-1/schedule/sm-1", "Scheduled messages"),
        ("get", "/v1/environments", "Environments"),
        ("post", "/v1/environments/env-1/messages", "Environments"),
        ("post", "/v1/client-side-access-tokens", "Client-side access tokens"),
        ("delete", "/v1/client-side-access-tokens/tok-1", "Client-side access tokens"),
    ],
)
def test_letta_cloud_features_are_a_json_501_never_retried(db, method, path, feature):
    response = getattr(APIClient(), method)(path, {}, format="json")

    assert response.status_code == 501
    assert response["x-should-retry"] == "false"
    assert response.json()["detail"].startswith(f"{feature} are Letta Cloud only")


def test_every_base_tool_name_is_registered():
    assert set(BUILTIN_TOOLS) == BUILTIN_SET
