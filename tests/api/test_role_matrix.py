"""The role matrix through /v1: every mutating endpoint, as an owner, an admin, the member who created the
object and another member. What each may do is apps.core.permissions.MATRIX (the README's table); a
refusal is a 403 with the reason and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.agents.groups import group_create
from apps.agents.models import Agent, AgentSecret, AgentTool, Group, GroupTurn, Message
from apps.agents.services import agent_create, agent_update
from apps.core.actor import Actor, Role
from apps.core.permissions import MATRIX, Action, Who, allows
from apps.memory import archival
from apps.memory.models import AgentBlock, Block, Passage
from apps.memory.services import block_create
from apps.tools.models import MCPServer, Tool
from apps.tools.services import tool_upsert
from tests.api.test_agent_file import import_file, letta_file
from tests.api.test_messages_api import insert_call, new_agent, send, user
from tests.support.scripted_llm import text, tool_calls

ROLES = ("owner", "admin", "creator", "member")
ADD = '''def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b
'''
EVIL_ADD = ADD.replace("return a + b", "return 0")


@dataclass
class World:
    """One organisation: its people, and what the member called "creator" made."""

    actors: dict[str, Actor]
    agent: Agent
    tool: Tool
    block: Block
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def creator(self) -> Actor:
        return self.actors["creator"]


@pytest.fixture
def world(org, make_user, db) -> World:
    actors = {}
    for name, role in (
        ("owner", Role.OWNER),
        ("admin", Role.ADMIN),
        ("creator", Role.MEMBER),
        ("member", Role.MEMBER),
    ):
        user = make_user(org, role=role, username=name)
        actors[name] = Actor(organization_id=org.id, user_id=user.id, role=role)
    creator = actors["creator"]
    tool = tool_upsert(actor=creator, source_code=ADD)
    agent = new_agent(
        creator, tool_ids=[tool.id], tool_rules=[{"type": "requires_approval", "tool_name": "add"}]
    )
    block = block_create(actor=creator, label="notes", value="mine", limit=100)
    return World(actors=actors, agent=agent, tool=tool, block=block)


@dataclass(frozen=True)
class Case:
    """One mutating request. `act` sends it; `changed` tells whether it took effect."""

    name: str
    action: Action
    act: Callable[[APIClient, World], Any]
    changed: Callable[[World], bool]
    prepare: Callable[[World], None] = lambda world: None
    by_creator: bool = True  # the object has a creator (the "creator" member)
    shared: bool = False  # other people's agents depend on it
    allowed_status: tuple[int, ...] = (200, 201, 204)
    takes_effect: bool = True  # False: an allowed request is refused later, for its input


def _agent(world: World) -> Agent:
    return Agent.objects.unscoped().get(id=world.agent.id)


def _attach_block(world: World) -> None:
    AgentBlock.objects.create(agent=world.agent, block=world.block, block_label=world.block.label)


def _with_passage(world: World) -> None:
    archive = archival.agent_archive(
        actor=world.creator, agent_id=world.agent.id, embedding_handle="openai/text-embedding-3-small"
    )
    world.extra["passage"] = Passage.objects.unscoped().create(
        organization_id=archive.organization_id,
        archive=archive,
        text="a fact",
        created_by_id=world.creator.user_id,
    )


def _with_context(world: World) -> None:
    message = Message.objects.unscoped().create(
        organization_id=world.agent.organization_id, agent=world.agent, role="user", text="hi", content=[]
    )
    agent_update(actor=world.creator, agent_id=world.agent.id, message_ids=[message.id])


def _owner_agent_uses_the_tool(world: World) -> None:
    agent_create(
        actor=world.actors["owner"], name="Owner's", model="openai/gpt-4o-mini", tool_ids=[world.tool.id]
    )


def _with_mcp_server(world: World) -> None:
    world.extra["server"] = MCPServer.objects.unscoped().create(
        organization_id=world.agent.organization_id,
        server_name="remote",
        server_type="streamable_http",
        server_url="https://mcp.example.com/mcp",
    )


def _with_group(world: World) -> None:
    world.extra["group"] = group_create(actor=world.creator, agent_ids=[world.agent.id], description="mine")


def _with_group_turn(world: World) -> None:
    _with_group(world)
    GroupTurn.objects.unscoped().create(
        organization_id=world.agent.organization_id, group=world.extra["group"], status="completed"
    )


def _group(world: World) -> Group | None:
    return Group.objects.unscoped().filter(id=world.extra["group"].id).first()


def _rules(world: World) -> list[dict[str, Any]]:
    return _agent(world).tool_rules


CASES = [
    Case(
        "create a group",
        Action.GROUP_CREATE,
        lambda c, w: c.post("/v1/groups/", {"agent_ids": [w.agent.id], "description": "new"}, format="json"),
        lambda w: Group.objects.unscoped().filter(description="new").exists(),
        by_creator=False,
    ),
    Case(
        "modify a group",
        Action.GROUP_WRITE,
        lambda c, w: c.patch(f"/v1/groups/{w.extra['group'].id}", {"description": "changed"}, format="json"),
        lambda w: getattr(_group(w), "description", None) == "changed",
        prepare=_with_group,
    ),
    Case(
        "delete a group",
        Action.GROUP_WRITE,
        lambda c, w: c.delete(f"/v1/groups/{w.extra['group'].id}"),
        lambda w: _group(w) is None,
        prepare=_with_group,
    ),
    Case(
        "reset a group's messages",
        Action.GROUP_WRITE,
        lambda c, w: c.patch(f"/v1/groups/{w.extra['group'].id}/reset-messages"),
        lambda w: not GroupTurn.objects.unscoped().filter(group_id=w.extra["group"].id).exists(),
        prepare=_with_group_turn,
    ),
    Case(
        "delete agent",
        Action.AGENT_DELETE,
        lambda c, w: c.delete(f"/v1/agents/{w.agent.id}"),
        lambda w: not Agent.objects.unscoped().filter(id=w.agent.id).exists(),
    ),
    Case(
        "modify agent",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}", {"description": "changed"}, format="json"),
        lambda w: _agent(w).description == "changed",
    ),
    Case(
        "set agent secrets",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}", {"secrets": {"TOKEN": "x"}}, format="json"),
        lambda w: AgentSecret.objects.unscoped().filter(agent_id=w.agent.id, key="TOKEN").exists(),
    ),
    Case(
        "set tool rules",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}", {"tool_rules": []}, format="json"),
        lambda w: _rules(w) == [],
    ),
    Case(
        "switch a tool's approval off",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.patch(
            f"/v1/agents/{w.agent.id}/tools/approval/add", {"requires_approval": False}, format="json"
        ),
        lambda w: not any(rule.get("type") == "requires_approval" for rule in _rules(w)),
    ),
    Case(
        "detach a tool",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}/tools/detach/{w.tool.id}"),
        lambda w: not AgentTool.objects.filter(agent_id=w.agent.id, tool_id=w.tool.id).exists(),
    ),
    Case(
        "attach a block",
        Action.BLOCK_WRITE,  # and AGENT_CONFIGURE: both are the creator's here
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}/core-memory/blocks/attach/{w.block.id}"),
        lambda w: AgentBlock.objects.filter(agent_id=w.agent.id, block_id=w.block.id).exists(),
    ),
    Case(
        "detach a block",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}/core-memory/blocks/detach/{w.block.id}"),
        lambda w: not AgentBlock.objects.filter(agent_id=w.agent.id, block_id=w.block.id).exists(),
        prepare=_attach_block,
    ),
    Case(
        "edit a core memory block",
        Action.BLOCK_WRITE,
        lambda c, w: c.patch(
            f"/v1/agents/{w.agent.id}/core-memory/blocks/human", {"value": "rewritten"}, format="json"
        ),
        lambda w: (
            Block.objects.unscoped().get(agent_attachments__agent_id=w.agent.id, label="human").value
            == "rewritten"
        ),
    ),
    Case(
        "reset messages",
        Action.AGENT_RESET_MESSAGES,
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}/reset-messages", {}, format="json"),
        lambda w: _agent(w).message_ids == [],
        prepare=_with_context,
    ),
    Case(
        "delete an archival passage",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.delete(f"/v1/agents/{w.agent.id}/archival-memory/{w.extra['passage'].id}"),
        lambda w: not Passage.objects.unscoped().filter(id=w.extra["passage"].id).exists(),
        prepare=_with_passage,
    ),
    Case(
        "modify a block",
        Action.BLOCK_WRITE,
        lambda c, w: c.patch(f"/v1/blocks/{w.block.id}", {"value": "theirs"}, format="json"),
        lambda w: Block.objects.unscoped().get(id=w.block.id).value == "theirs",
    ),
    Case(
        "delete a block",
        Action.BLOCK_WRITE,
        lambda c, w: c.delete(f"/v1/blocks/{w.block.id}"),
        lambda w: not Block.objects.unscoped().filter(id=w.block.id).exists(),
    ),
    Case(
        "modify a tool",
        Action.TOOL_WRITE,
        lambda c, w: c.patch(f"/v1/tools/{w.tool.id}", {"default_requires_approval": True}, format="json"),
        lambda w: Tool.objects.unscoped().get(id=w.tool.id).default_requires_approval,
    ),
    Case(
        "replace a tool by name",
        Action.TOOL_WRITE,
        lambda c, w: c.put("/v1/tools/", {"source_code": EVIL_ADD}, format="json"),
        lambda w: Tool.objects.unscoped().get(id=w.tool.id).source_code == EVIL_ADD,
    ),
    Case(
        "delete a tool",
        Action.TOOL_WRITE,
        lambda c, w: c.delete(f"/v1/tools/{w.tool.id}"),
        lambda w: not Tool.objects.unscoped().filter(id=w.tool.id).exists(),
    ),
    Case(
        "replace a tool other people's agents use",
        Action.TOOL_WRITE,
        lambda c, w: c.put("/v1/tools/", {"source_code": EVIL_ADD}, format="json"),
        lambda w: Tool.objects.unscoped().get(id=w.tool.id).source_code == EVIL_ADD,
        prepare=_owner_agent_uses_the_tool,
        shared=True,
    ),
    Case(
        "run tool code by hand",
        Action.TOOL_RUN_CODE,
        # Past the role check, a broken source is the caller's 400: nothing runs either way.
        lambda c, w: c.post("/v1/tools/run", {"source_code": "def broken(:", "args": {}}, format="json"),
        lambda w: False,
        by_creator=False,
        allowed_status=(400,),
        takes_effect=False,
    ),
    Case(
        "give a tool pip requirements",
        Action.TOOL_PIP_REQUIREMENTS,
        lambda c, w: c.patch(
            f"/v1/tools/{w.tool.id}", {"pip_requirements": [{"name": "requests"}]}, format="json"
        ),
        lambda w: Tool.objects.unscoped().get(id=w.tool.id).pip_requirements == [{"name": "requests"}],
    ),
    Case(
        "add an MCP server",
        Action.MCP_SERVER_MANAGE,
        lambda c, w: c.post(
            "/v1/mcp-servers/",
            {"server_name": "new", "config": {"mcp_server_type": "streamable_http", "server_url": "ftp://x"}},
            format="json",
        ),
        lambda w: MCPServer.objects.unscoped().filter(server_name="new").exists(),
        by_creator=False,
        allowed_status=(400, 422),
        takes_effect=False,
    ),
    Case(
        "rename an MCP server",
        Action.MCP_SERVER_MANAGE,
        lambda c, w: c.patch(
            f"/v1/mcp-servers/{w.extra['server'].id}", {"server_name": "renamed"}, format="json"
        ),
        lambda w: MCPServer.objects.unscoped().get(id=w.extra["server"].id).server_name == "renamed",
        prepare=_with_mcp_server,
        by_creator=False,
    ),
    Case(
        "delete an MCP server",
        Action.MCP_SERVER_MANAGE,
        lambda c, w: c.delete(f"/v1/mcp-servers/{w.extra['server'].id}"),
        lambda w: not MCPServer.objects.unscoped().filter(id=w.extra["server"].id).exists(),
        prepare=_with_mcp_server,
        by_creator=False,
    ),
    Case(
        "create an agent",
        Action.AGENT_CREATE,
        lambda c, w: c.post("/v1/agents/", {"name": "fresh", "model": "openai/gpt-4o-mini"}, format="json"),
        lambda w: Agent.objects.unscoped().filter(name="fresh").exists(),
        by_creator=False,
    ),
    Case(
        "create a block",
        Action.BLOCK_CREATE,
        lambda c, w: c.post("/v1/blocks/", {"label": "fresh", "value": "v"}, format="json"),
        lambda w: Block.objects.unscoped().filter(label="fresh").exists(),
        by_creator=False,
    ),
    Case(
        "create a tool under a new name",
        Action.TOOL_CREATE,
        lambda c, w: c.post("/v1/tools/", {"source_code": ADD.replace("def add", "def plus")}, format="json"),
        lambda w: Tool.objects.unscoped().filter(name="plus").exists(),
        by_creator=False,
    ),
    Case(
        "open a conversation",
        Action.AGENT_USE,
        lambda c, w: c.post(f"/v1/conversations/?agent_id={w.agent.id}", {}, format="json"),
        lambda w: w.agent.conversations.exists(),
    ),
]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_api_does_what_the_matrix_says(case: Case, role: str, world: World, api_client_for: Any) -> None:
    case.prepare(world)
    actor = world.actors[role]
    expected = allows(
        actor, case.action, creator_id=world.creator.user_id if case.by_creator else None, shared=case.shared
    )

    response = case.act(api_client_for(actor), world)

    if expected:
        assert response.status_code in case.allowed_status, response.content
        assert case.changed(world) is case.takes_effect
    else:
        assert response.status_code == 403, response.content
        assert response.json()["detail"].startswith("Not allowed"), response.json()
        assert not case.changed(world)


def test_every_mutating_action_of_the_matrix_is_driven() -> None:
    """A new row in the matrix needs a case here (API or ADE), or it is enforced nowhere we can see."""
    through_the_ade = {  # and, for these two, tests/api/test_providers_api.py, test_sandbox_config_api.py
        Action.PROVIDER_MANAGE,
        Action.SANDBOX_MANAGE,
        Action.API_KEY_OWN,
        Action.API_KEY_REVOKE_OTHERS,
        Action.API_KEY_MINT_FOR_OTHERS,
        Action.MEMBER_MANAGE,
        Action.APPROVAL_RESPOND,  # tests below
        Action.AGENT_FILE_IMPORT_AS_IS,  # tests below
        Action.RUN_CANCEL,
        Action.STEP_FEEDBACK,
    }
    in_their_own_modules = {  # each module drives its actions as the four people
        Action.CONVERSATION_WRITE,  # tests/api/test_conversations_api.py
        Action.ARCHIVE_CREATE,  # tests/api/test_archives_api.py
        Action.ARCHIVE_WRITE,
        Action.IDENTITY_CREATE,  # tests/api/test_identities_api.py
        Action.IDENTITY_WRITE,
    }
    driven = {case.action for case in CASES} | through_the_ade | in_their_own_modules
    assert set(MATRIX) <= driven


def test_the_baseline_the_issue_asked_for() -> None:
    """Members manage what is theirs; what the organisation shares is for owners and admins."""
    assert MATRIX[Action.AGENT_DELETE].who is Who.CREATOR_OR_ADMIN
    assert MATRIX[Action.MCP_SERVER_MANAGE].who is Who.ADMIN
    assert MATRIX[Action.PROVIDER_MANAGE].who is Who.ADMIN
    assert MATRIX[Action.SANDBOX_MANAGE].who is Who.ADMIN
    assert MATRIX[Action.MEMBER_MANAGE].who is Who.OWNER


# --- approvals: the creator's decision ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("role", ROLES)
def test_only_the_creator_or_an_admin_answers_an_approval(role, world, api_client_for, llm, celery_worker):
    rules = [{"type": "requires_approval", "tool_name": "memory_insert"}]
    agent = new_agent(world.creator, name="Careful", tool_rules=rules)
    llm.push(tool_calls(insert_call()), text("Understood."))
    asked = send(api_client_for(world.creator), agent.id, user("remember I like tea"))
    assert asked.json()["stop_reason"]["stop_reason"] == "requires_approval"
    actor = world.actors[role]
    deny = {
        "type": "approval",
        "approvals": [{"type": "approval", "tool_call_id": "call_ins", "approve": False}],
    }

    response = send(api_client_for(actor), agent.id, {"messages": [deny]})

    if allows(actor, Action.APPROVAL_RESPOND, creator_id=world.creator.user_id):
        assert response.status_code == 200, response.content
        assert response.json()["messages"][0]["status"] == "error"  # the denial, as the model reads it
    else:
        assert response.status_code == 403
        assert "approve or deny a tool call" in response.json()["detail"]
        still = send(api_client_for(world.creator), agent.id, user("hello?"))
        assert still.status_code == 409  # the call still awaits its creator's decision


# --- agent-file import --------------------------------------------------------------------------------


def _hostile_file(server: MCPServer) -> dict[str, Any]:
    """A file that would overwrite the organisation's `add`, mint a tool on its MCP server and arrive
    with a tool call awaiting approval."""
    document = letta_file()
    agent = document["agents"][0]
    document["tools"] += [
        {"id": "tool-2", "name": "add", "tool_type": "custom", "source_code": EVIL_ADD},
        {
            "id": "tool-3",
            "name": "remote_thing",
            "tool_type": "external_mcp",
            "source_code": "def remote_thing(): pass",
            "json_schema": {"name": "remote_thing", "parameters": {"type": "object", "properties": {}}},
            "metadata_": {
                "mcp": {"server_id": server.id, "server_name": server.server_name, "tool_name": "x"}
            },
        },
    ]
    agent["tool_ids"] = ["tool-2", "tool-3"]
    agent["messages"].append(
        {
            "id": "message-3",
            "role": "approval",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                }
            ],
        }
    )
    agent["in_context_message_ids"].append("message-3")
    return document


def test_a_members_import_overwrites_nothing_binds_no_mcp_tool_and_brings_no_pending_approval(
    world, api_client_for
):
    _owner_agent_uses_the_tool(world)
    _with_mcp_server(world)

    response = import_file(
        api_client_for(world.actors["member"]), json.dumps(_hostile_file(world.extra["server"]))
    )

    assert response.status_code == 200, response.content
    refused = {(item["kind"], item["name"]) for item in response.json()["refused"]}
    assert refused == {("tool", "add"), ("tool", "remote_thing"), ("message", "message-3")}
    assert Tool.objects.unscoped().get(id=world.tool.id).source_code == ADD
    assert not Tool.objects.unscoped().filter(name="remote_thing").exists()
    [agent_id] = response.json()["agent_ids"]
    imported = Agent.objects.unscoped().get(id=agent_id)
    assert list(imported.tools.values_list("id", flat=True)) == [world.tool.id]
    last = Message.objects.unscoped().get(id=imported.message_ids[-1])
    assert last.role != Message.Role.APPROVAL


def test_an_admins_import_is_taken_as_written(world, api_client_for):
    _with_mcp_server(world)

    response = import_file(
        api_client_for(world.actors["admin"]), json.dumps(_hostile_file(world.extra["server"]))
    )

    assert response.status_code == 200, response.content
    assert response.json()["refused"] == []
    assert Tool.objects.unscoped().get(id=world.tool.id).source_code == EVIL_ADD
    assert Tool.objects.unscoped().filter(name="remote_thing", tool_type=Tool.Type.EXTERNAL_MCP).exists()
    imported = Agent.objects.unscoped().get(id=response.json()["agent_ids"][0])
    assert Message.objects.unscoped().get(id=imported.message_ids[-1]).role == Message.Role.APPROVAL
