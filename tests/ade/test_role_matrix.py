"""The role matrix through the ADE: every mutating page action, as an owner, an admin, the member who created
the object and another member (the /v1 twin is tests/api/test_role_matrix.py). What each may do is
apps.core.permissions.MATRIX; a refusal is a 403 whose page or partial says "Not allowed", and changes
nothing. (The members and invitations settings pages have their own tests.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import HttpResponse
from django.test import Client
from django.urls import reverse

from apps.accounts.models import ApiKey, Organization, User
from apps.accounts.services import api_key_create
from apps.ade.starter_templates import DEFAULT_TEMPLATE
from apps.agents.loop.events import ListSink
from apps.agents.models import Agent, AgentSecret, AgentTool, Message, Run, Step
from apps.agents.services import (
    BlockSpec,
    MessageIn,
    agent_create,
    agent_passage_insert,
    agent_send_message,
    run_create,
)
from apps.core.actor import Actor, Role
from apps.core.permissions import Action, allows
from apps.folders import services as folder_services
from apps.folders.ingest import ingest_file
from apps.folders.models import AgentFile, FileMetadata, Folder
from apps.identities import services as identity_services
from apps.identities.models import Identity
from apps.llm.models import Provider
from apps.llm.services import provider_create
from apps.memory import services as memory_services
from apps.memory.models import Archive, Block, Passage
from apps.memory.selectors import block_history
from apps.memory.services import block_update
from apps.tools.models import MCPServer, Tool
from apps.tools.services import tool_upsert
from tests.api.test_role_matrix import ADD, EVIL_ADD, _hostile_file
from tests.support.scripted_llm import ScriptedLLM, text, tool_call, tool_calls

ROLES = ("owner", "admin", "creator", "member")
HTMX: dict[str, Any] = {"HTTP_HX_REQUEST": "true"}
MUL = ADD.replace("def add", "def mul").replace("Add two", "Multiply two").replace("a + b", "a * b")
MAX_TWICE = {"type": "max_count_per_step", "tool_name": "add", "max_count_limit": 2}
APPROVE_INSERTS = [{"type": "requires_approval", "tool_name": "memory_insert"}]


@dataclass
class World:
    """One organisation: its people (and a bystander, whose API key nobody else owns), and what the
    member called "creator" made: an agent with a secret, two tools (one attached) and core memory."""

    actors: dict[str, Actor]
    users: dict[str, User]
    agent: Agent
    tool: Tool
    spare_tool: Tool
    llm: ScriptedLLM
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def creator(self) -> Actor:
        return self.actors["creator"]


@pytest.fixture
def world(org: Organization, make_user: Callable[..., User], llm: ScriptedLLM) -> World:
    actors, users = {}, {}
    for name, role in (
        ("owner", Role.OWNER),
        ("admin", Role.ADMIN),
        ("creator", Role.MEMBER),
        ("member", Role.MEMBER),
        ("bystander", Role.MEMBER),
    ):
        users[name] = make_user(org, role=role, username=name)
        actors[name] = Actor(organization_id=org.id, user_id=users[name].id, role=role)
    creator = actors["creator"]
    tool = tool_upsert(actor=creator, source_code=ADD)
    spare_tool = tool_upsert(actor=creator, source_code=MUL)
    agent = agent_create(
        actor=creator,
        name="Assistant",
        model="openai/gpt-4o-mini",
        embedding="openai/text-embedding-3-small",
        memory_blocks=[
            BlockSpec(label="human", value="Name: unknown", limit=2000),
            BlockSpec(label="persona", value="I am a helpful assistant.", limit=2000),
        ],
        tool_ids=[tool.id],
        tool_rules=[MAX_TWICE],
        secrets_={"TOKEN": "s3cret"},
    )
    return World(actors=actors, users=users, agent=agent, tool=tool, spare_tool=spare_tool, llm=llm)


@dataclass(frozen=True)
class Case:
    """One mutating request. `prepare` gets the acting role; `act` sends the request; `changed` tells
    whether it took effect."""

    name: str
    action: Action
    act: Callable[[Client, World], Any]  # the test client's response
    changed: Callable[[World], bool]
    prepare: Callable[[World, str], None] = lambda world, role: None
    by_creator: bool = True  # the object has a creator (the "creator" member)
    shared: bool = False  # other people's agents depend on it
    allowed_status: tuple[int, ...] = (200,)
    takes_effect: bool = True  # False: an allowed request is refused later, for its input
    refused_status: int = 403
    says: str = "Not allowed"  # what a refusal's page or partial shows


# --- helpers: where things stand ------------------------------------------------------------------------


def _agent(world: World) -> Agent:
    return Agent.objects.unscoped().get(id=world.agent.id)


def _block(world: World, label: str = "human") -> Block:
    return Block.objects.unscoped().get(agent_attachments__agent_id=world.agent.id, label=label)


def _rule_index(world: World, rule_type: str) -> int:
    return next(i for i, rule in enumerate(_agent(world).tool_rules) if rule["type"] == rule_type)


def _max_count(world: World) -> int:
    return _agent(world).tool_rules[_rule_index(world, "max_count_per_step")]["max_count_limit"]


def _passages(world: World) -> list[str]:
    return list(
        Passage.objects.unscoped().filter(archive__agents__id=world.agent.id).values_list("text", flat=True)
    )


def _revoked(world: World) -> bool:
    return ApiKey.objects.unscoped().get(id=world.extra["key"].id).revoked_at is not None


# --- helpers: what a case needs first ---------------------------------------------------------------------


def _history(world: World, role: str) -> None:
    """The human block, edited once by its creator: version 1 is "Name: unknown" again."""
    block = _block(world)
    block_update(actor=world.creator, block_id=block.id, value="Name: Ada")
    world.extra["first"] = block_history(actor=world.creator, block_id=block.id).get(version=1)


def _with_passage(world: World, role: str) -> None:
    agent_passage_insert(actor=world.creator, agent_id=world.agent.id, text="a fact", tags=[])


def _owner_agent_uses_the_tool(world: World, role: str) -> None:
    agent_create(
        actor=world.actors["owner"], name="Owner's", model="openai/gpt-4o-mini", tool_ids=[world.tool.id]
    )


def _pending_approval(world: World, role: str) -> None:
    """The creator's agent "Careful" stopped on a memory_insert call awaiting a decision."""
    careful = agent_create(
        actor=world.creator,
        name="Careful",
        model="openai/gpt-4o-mini",
        memory_blocks=[BlockSpec(label="human", value="Name: unknown", limit=2000)],
        tool_rules=APPROVE_INSERTS,
    )
    world.llm.push(tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "tea"}, id="c1")))
    result = agent_send_message(
        actor=world.creator, agent_id=careful.id, sink=ListSink(), messages=[MessageIn(content="I like tea")]
    )
    assert result.stop_reason == "requires_approval"
    world.extra["careful"] = careful
    world.extra["request"] = Message.objects.unscoped().get(agent=careful, role="approval")


def _decided(world: World) -> bool:
    return (
        Message.objects.unscoped()
        .filter(agent=world.extra["careful"], role="approval", approvals__isnull=False)
        .exists()
    )


def _decide(decision: str) -> Callable[[Client, World], HttpResponse]:
    def act(client: Client, world: World) -> HttpResponse:
        careful = world.extra["careful"]
        data = {"request_id": world.extra["request"].id, "decision": decision, "reason": "not now"}
        return client.post(reverse("ade:conversation-approve", args=[careful.id]), data, **HTMX)

    return act


def _with_run(world: World, role: str) -> None:
    world.extra["run"] = run_create(
        actor=world.creator, agent_id=world.agent.id, messages=[MessageIn(content="hi")]
    )


def _with_step(world: World, role: str) -> None:
    world.llm.push(text("Hello!"))
    agent_send_message(
        actor=world.creator, agent_id=world.agent.id, sink=ListSink(), messages=[MessageIn(content="hi")]
    )
    world.extra["step"] = Step.objects.unscoped().get(agent_id=world.agent.id)


def _with_provider(world: World, role: str) -> None:
    world.extra["provider"] = provider_create(
        actor=world.actors["owner"], name="byok", provider_type="openai", api_key="sk-not-a-real-key"
    )


def _own_key(world: World, role: str) -> None:
    world.extra["key"] = api_key_create(actor=world.actors[role], user=world.users[role], name="mine").api_key


def _bystanders_key(world: World, role: str) -> None:
    bystander = world.actors["bystander"]
    world.extra["key"] = api_key_create(actor=bystander, user=world.users["bystander"], name="theirs").api_key


FOLDER_EMBEDDING = "openai/text-embedding-small-384"


def _with_folder(world: World, role: str) -> None:
    world.extra["folder"] = folder_services.folder_create(
        actor=world.creator, name="handbook", embedding_handle=FOLDER_EMBEDDING
    )


def _with_archive(world: World, role: str) -> None:
    """The creator's shared archive with one passage."""
    archive = memory_services.archive_create(actor=world.creator, name="notes")
    _, [passage] = memory_services.archive_passages_create(
        actor=world.creator, archive_id=archive.id, passages=[memory_services.PassageSpec(text="kept")]
    )
    world.extra["archive"], world.extra["passage"] = archive, passage


def _with_identity(world: World, role: str) -> None:
    world.extra["identity"] = identity_services.identity_create(
        actor=world.creator, identifier_key="user-1", name="Sam", identity_type="user"
    )


def _identity(world: World) -> Identity | None:
    return Identity.objects.unscoped().filter(id=world.extra["identity"].id).first()


def _archive_texts(world: World) -> set[str]:
    passages = Passage.objects.unscoped().filter(archive_id=world.extra["archive"].id)
    return set(passages.values_list("text", flat=True))


def _with_file(world: World, role: str) -> None:
    """The creator's folder with one ingested file (ingested here: the worker's task waits for a commit)."""
    _with_folder(world, role)
    result = folder_services.file_upload(
        actor=world.creator,
        folder_id=world.extra["folder"].id,
        filename="notes.txt",
        content_type="text/plain",
        data=b"Tea is served at four.\n",
    )
    ingest_file(result.file.id)
    world.extra["file"] = result.file


def _with_attached_folder(world: World, role: str) -> None:
    """The creator attached its folder to its agent: notes.txt is open."""
    _with_file(world, role)
    folder_services.agent_attach_folder(
        actor=world.creator, agent_id=world.agent.id, folder_id=world.extra["folder"].id
    )


def _with_closed_file(world: World, role: str) -> None:
    _with_attached_folder(world, role)
    folder_services.agent_file_close(
        actor=world.creator, agent_id=world.agent.id, file_id=world.extra["file"].id
    )


def _folder_exists(world: World) -> bool:
    return Folder.objects.unscoped().filter(id=world.extra["folder"].id).exists()


def _attached(world: World) -> bool:
    return Folder.agents.through.objects.filter(
        agent_id=world.agent.id, folder_id=world.extra["folder"].id
    ).exists()


def _file_open(world: World) -> bool:
    return AgentFile.objects.unscoped().get(agent_id=world.agent.id, file_id=world.extra["file"].id).is_open


def _config(world: World, rest: str) -> str:
    return f"/agents/{world.agent.id}/config/{rest}"


def _memory(world: World, rest: str) -> str:
    return f"/agents/{world.agent.id}/memory/{rest}"


CASES = [
    # --- the agent list -----------------------------------------------------------------------------------
    Case(
        "delete agent",
        Action.AGENT_DELETE,
        lambda c, w: c.post(reverse("ade:agent-delete", args=[w.agent.id]), **HTMX),
        lambda w: not Agent.objects.unscoped().filter(id=w.agent.id).exists(),
    ),
    Case(
        "create an agent",
        Action.AGENT_CREATE,
        lambda c, w: c.post(
            reverse("ade:agent-create"),
            {"template": DEFAULT_TEMPLATE, "name": "fresh", "model": "openai/scripted-chat", "embedding": ""},
            **HTMX,
        ),
        lambda w: Agent.objects.unscoped().filter(name="fresh").exists(),
        by_creator=False,
        allowed_status=(204,),
    ),
    # --- configuration column -----------------------------------------------------------------------------
    Case(
        "save the system prompt",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.post(_config(w, "field/system/"), {"value": "You are terse."}, **HTMX),
        lambda w: _agent(w).system == "You are terse.",
    ),
    Case(
        "rename the agent",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.post(_config(w, "field/name/"), {"value": "Renamed"}, **HTMX),
        lambda w: _agent(w).name == "Renamed",
    ),
    Case(
        "attach a tool",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.post(_config(w, "tools/attach/"), {"tool": w.spare_tool.id}, **HTMX),
        lambda w: AgentTool.objects.filter(agent_id=w.agent.id, tool_id=w.spare_tool.id).exists(),
    ),
    Case(
        "detach a tool",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.post(_config(w, f"tools/{w.tool.id}/detach/"), **HTMX),
        lambda w: not AgentTool.objects.filter(agent_id=w.agent.id, tool_id=w.tool.id).exists(),
    ),
    Case(
        "add a tool rule",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.post(_config(w, "rules/new/"), {"type": "exit_loop", "tool_name": "add"}, **HTMX),
        lambda w: {"type": "exit_loop", "tool_name": "add"} in _agent(w).tool_rules,
    ),
    Case(
        "edit a tool rule",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.post(
            _config(w, f"rules/{_rule_index(w, 'max_count_per_step')}/"),
            {"tool_name": "add", "max_count_limit": "3"},
            **HTMX,
        ),
        lambda w: _max_count(w) == 3,
    ),
    Case(
        "delete a tool rule",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.post(_config(w, f"rules/{_rule_index(w, 'max_count_per_step')}/delete/"), **HTMX),
        lambda w: MAX_TWICE not in _agent(w).tool_rules,
    ),
    Case(
        "switch sleeptime on",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.post(_config(w, "sleeptime/"), {"enabled": "on", "frequency": "5"}, **HTMX),
        lambda w: _agent(w).enable_sleeptime,
    ),
    # --- memory column ------------------------------------------------------------------------------------
    Case(
        "save a core memory block",
        Action.BLOCK_WRITE,
        lambda c, w: c.post(
            _memory(w, f"blocks/{_block(w).id}/"),
            {"value": "rewritten", "version": _block(w).version},
            **HTMX,
        ),
        lambda w: _block(w).value == "rewritten",
    ),
    Case(
        "restore a block's version",
        Action.BLOCK_WRITE,
        lambda c, w: c.post(
            _memory(w, f"blocks/{_block(w).id}/history/{w.extra['first'].id}/restore/"), **HTMX
        ),
        lambda w: _block(w).value == "Name: unknown",
        prepare=_history,
    ),
    Case(
        "insert an archival passage",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.post(_memory(w, "archival/"), {"text": "Ada likes tea", "tags": "food"}, **HTMX),
        lambda w: "Ada likes tea" in _passages(w),
    ),
    Case(
        "delete an archival passage",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.post(
            _memory(w, f"archival/{Passage.objects.unscoped().get(text='a fact').id}/delete/"),
            {"q": "", "tag": ""},
            **HTMX,
        ),
        lambda w: "a fact" not in _passages(w),
        prepare=_with_passage,
    ),
    # --- tool pages ---------------------------------------------------------------------------------------
    Case(
        "create a tool under a new name",
        Action.TOOL_CREATE,
        lambda c, w: c.post(
            reverse("ade:tool-new"), {"source_code": ADD.replace("def add", "def plus")}, **HTMX
        ),
        lambda w: Tool.objects.unscoped().filter(name="plus").exists(),
        by_creator=False,
        allowed_status=(204,),
    ),
    Case(
        "save a tool's code",
        Action.TOOL_WRITE,
        lambda c, w: c.post(reverse("ade:tool-detail", args=[w.tool.id]), {"source_code": EVIL_ADD}, **HTMX),
        lambda w: Tool.objects.unscoped().get(id=w.tool.id).source_code == EVIL_ADD,
    ),
    Case(
        "save the code of a tool other people's agents use",
        Action.TOOL_WRITE,
        lambda c, w: c.post(reverse("ade:tool-detail", args=[w.tool.id]), {"source_code": EVIL_ADD}, **HTMX),
        lambda w: Tool.objects.unscoped().get(id=w.tool.id).source_code == EVIL_ADD,
        prepare=_owner_agent_uses_the_tool,
        shared=True,
    ),
    Case(
        "delete a tool",
        Action.TOOL_WRITE,
        lambda c, w: c.post(reverse("ade:tool-delete", args=[w.tool.id]), **HTMX),
        lambda w: not Tool.objects.unscoped().filter(id=w.tool.id).exists(),
        allowed_status=(204,),
    ),
    Case(
        "run tool code in the tool runner",
        Action.TOOL_RUN_CODE,
        # Past the role check, a broken source is the caller's 422: nothing runs either way.
        lambda c, w: c.post(reverse("ade:tool-run"), {"source_code": "def broken(:", "args": "{}"}, **HTMX),
        lambda w: False,
        by_creator=False,
        allowed_status=(422,),
        takes_effect=False,
    ),
    # --- folder pages -------------------------------------------------------------------------------------
    Case(
        "create a folder",
        Action.ARCHIVE_CREATE,
        lambda c, w: c.post(
            reverse("ade:folder-create"), {"name": "fresh", "embedding": FOLDER_EMBEDDING}, **HTMX
        ),
        lambda w: Folder.objects.unscoped().filter(name="fresh").exists(),
        by_creator=False,
        allowed_status=(204,),
    ),
    Case(
        "delete a folder",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.post(reverse("ade:folder-delete", args=[w.extra["folder"].id]), **HTMX),
        lambda w: not _folder_exists(w),
        prepare=_with_folder,
    ),
    Case(
        "upload a file to a folder",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.post(
            reverse("ade:folder-upload", args=[w.extra["folder"].id]),
            {"file": SimpleUploadedFile("new.txt", b"fresh", content_type="text/plain")},
            **HTMX,
        ),
        lambda w: FileMetadata.objects.unscoped().filter(file_name="new.txt").exists(),
        prepare=_with_folder,
    ),
    Case(
        "delete a file of a folder",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.post(
            reverse("ade:folder-file-delete", args=[w.extra["folder"].id, w.extra["file"].id]), **HTMX
        ),
        lambda w: not FileMetadata.objects.unscoped().filter(id=w.extra["file"].id).exists(),
        prepare=_with_file,
    ),
    # --- archive pages --------------------------------------------------------------------------------------
    Case(
        "create an archive",
        Action.ARCHIVE_CREATE,
        lambda c, w: c.post(reverse("ade:archive-create"), {"name": "shared", "embedding": ""}, **HTMX),
        lambda w: Archive.objects.unscoped().filter(name="shared").exists(),
        by_creator=False,
        allowed_status=(204,),
    ),
    Case(
        "delete an archive",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.post(reverse("ade:archive-delete", args=[w.extra["archive"].id]), **HTMX),
        lambda w: not Archive.objects.unscoped().filter(id=w.extra["archive"].id).exists(),
        prepare=_with_archive,
        allowed_status=(204,),
    ),
    Case(
        "add a passage to an archive",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.post(
            reverse("ade:archive-passage-add", args=[w.extra["archive"].id]), {"text": "added"}, **HTMX
        ),
        lambda w: "added" in _archive_texts(w),
        prepare=_with_archive,
    ),
    Case(
        "delete a passage of an archive",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.post(
            reverse("ade:archive-passage-delete", args=[w.extra["archive"].id, w.extra["passage"].id]),
            **HTMX,
        ),
        lambda w: "kept" not in _archive_texts(w),
        prepare=_with_archive,
    ),
    # --- identity pages -------------------------------------------------------------------------------------
    Case(
        "create an identity",
        Action.IDENTITY_CREATE,
        lambda c, w: c.post(
            reverse("ade:identity-create"),
            {"identifier_key": "fresh", "name": "Fresh", "identity_type": "user"},
            **HTMX,
        ),
        lambda w: Identity.objects.unscoped().filter(identifier_key="fresh").exists(),
        by_creator=False,
        allowed_status=(204,),
    ),
    Case(
        "rename an identity",
        Action.IDENTITY_WRITE,
        lambda c, w: c.post(
            reverse("ade:identity-edit", args=[w.extra["identity"].id]),
            {"identifier_key": "user-1", "name": "Renamed", "identity_type": "user"},
            **HTMX,
        ),
        lambda w: getattr(_identity(w), "name", None) == "Renamed",
        prepare=_with_identity,
        allowed_status=(204,),
    ),
    Case(
        "set a property of an identity",
        Action.IDENTITY_WRITE,
        lambda c, w: c.post(
            reverse("ade:identity-property-set", args=[w.extra["identity"].id]),
            {"key": "plan", "type": "string", "value": "pro"},
            **HTMX,
        ),
        lambda w: bool(getattr(_identity(w), "properties", [])),
        prepare=_with_identity,
        allowed_status=(204,),
    ),
    Case(
        "delete an identity",
        Action.IDENTITY_WRITE,
        lambda c, w: c.post(reverse("ade:identity-delete", args=[w.extra["identity"].id]), **HTMX),
        lambda w: _identity(w) is None,
        prepare=_with_identity,
        allowed_status=(204,),
    ),
    # --- the workspace's Folders panel (the agent's creator's folder: AGENT_CONFIGURE and ARCHIVE_WRITE) --
    Case(
        "attach a folder to the agent",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.post(
            reverse("ade:workspace-folder-attach", args=[w.agent.id]),
            {"folder": w.extra["folder"].id},
            **HTMX,
        ),
        _attached,
        prepare=_with_file,
    ),
    Case(
        "detach a folder from the agent",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.post(
            reverse("ade:workspace-folder-detach", args=[w.agent.id, w.extra["folder"].id]), **HTMX
        ),
        lambda w: not _attached(w),
        prepare=_with_attached_folder,
    ),
    Case(
        "open a file for the agent",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.post(
            reverse("ade:workspace-file-open", args=[w.agent.id, w.extra["file"].id]), **HTMX
        ),
        _file_open,
        prepare=_with_closed_file,
    ),
    Case(
        "close a file of the agent",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.post(
            reverse("ade:workspace-file-close", args=[w.agent.id, w.extra["file"].id]), **HTMX
        ),
        lambda w: not _file_open(w),
        prepare=_with_attached_folder,
    ),
    Case(
        "close all the agent's files",
        Action.AGENT_CONFIGURE,
        lambda c, w: c.post(reverse("ade:workspace-files-close-all", args=[w.agent.id]), **HTMX),
        lambda w: not _file_open(w),
        prepare=_with_attached_folder,
    ),
    # --- conversation column ------------------------------------------------------------------------------
    Case(
        "approve a pending tool call",
        Action.APPROVAL_RESPOND,
        _decide("approve"),
        _decided,
        prepare=_pending_approval,
    ),
    Case(
        "deny a pending tool call",
        Action.APPROVAL_RESPOND,
        _decide("deny"),
        _decided,
        prepare=_pending_approval,
    ),
    Case(
        "send a message",
        Action.AGENT_USE,
        lambda c, w: c.post(reverse("ade:conversation-send", args=[w.agent.id]), {"text": "hello"}, **HTMX),
        lambda w: Message.objects.unscoped().filter(agent_id=w.agent.id, text="hello").exists(),
    ),
    Case(
        "open a conversation",
        Action.AGENT_USE,
        lambda c, w: c.post(reverse("ade:conversation-new", args=[w.agent.id]), **HTMX),
        lambda w: _agent(w).conversations.exists(),
    ),
    Case(
        "cancel a run",
        Action.RUN_CANCEL,
        lambda c, w: c.post(reverse("ade:conversation-cancel", args=[w.agent.id, w.extra["run"].id]), **HTMX),
        lambda w: Run.objects.unscoped().get(id=w.extra["run"].id).status == Run.Status.CANCELLED,
        prepare=_with_run,
    ),
    Case(
        "give feedback on a step",
        Action.STEP_FEEDBACK,
        lambda c, w: c.post(
            reverse("ade:step-feedback", args=[w.extra["step"].id]), {"feedback": "positive"}, **HTMX
        ),
        lambda w: Step.objects.unscoped().get(id=w.extra["step"].id).feedback == Step.Feedback.POSITIVE,
        prepare=_with_step,
    ),
    # --- settings: providers and API keys -----------------------------------------------------------------
    Case(
        "add an LLM provider",
        Action.PROVIDER_MANAGE,
        lambda c, w: c.post(
            reverse("ade:settings-providers"),
            {"provider_type": "openai", "name": "byok", "api_key": "sk-not-a-real-key", "base_url": ""},
            **HTMX,
        ),
        lambda w: Provider.objects.unscoped().filter(name="byok").exists(),
        by_creator=False,
    ),
    Case(
        "add an LLM provider with a form the service refuses",
        Action.PROVIDER_MANAGE,
        # A refusal comes before validation: a member never learns what is wrong with the form.
        lambda c, w: c.post(
            reverse("ade:settings-providers"), {"provider_type": "nonsense", "name": ""}, **HTMX
        ),
        lambda w: Provider.objects.unscoped().exists(),
        by_creator=False,
        allowed_status=(422,),
        takes_effect=False,
    ),
    Case(
        "delete an LLM provider",
        Action.PROVIDER_MANAGE,
        lambda c, w: c.post(reverse("ade:settings-provider-delete", args=[w.extra["provider"].id]), **HTMX),
        lambda w: not Provider.objects.unscoped().filter(id=w.extra["provider"].id).exists(),
        prepare=_with_provider,
        by_creator=False,
    ),
    Case(
        "create one's own API key",
        Action.API_KEY_OWN,
        lambda c, w: c.post(reverse("ade:settings-api-keys"), {"name": "laptop"}, **HTMX),
        lambda w: ApiKey.objects.unscoped().filter(name="laptop").exists(),
        by_creator=False,
    ),
    Case(
        "revoke one's own API key",
        Action.API_KEY_OWN,
        lambda c, w: c.post(reverse("ade:settings-api-key-revoke", args=[w.extra["key"].id]), **HTMX),
        _revoked,
        prepare=_own_key,
        by_creator=False,
    ),
    Case(
        "revoke someone else's API key",
        Action.API_KEY_REVOKE_OTHERS,
        lambda c, w: c.post(reverse("ade:settings-api-key-revoke", args=[w.extra["key"].id]), **HTMX),
        _revoked,
        prepare=_bystanders_key,
        by_creator=False,
        refused_status=404,  # a member cannot see other people's keys
        says="",
    ),
]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_ade_does_what_the_matrix_says(case: Case, role: str, world: World, client: Client) -> None:
    case.prepare(world, role)
    actor = world.actors[role]
    expected = allows(
        actor, case.action, creator_id=world.creator.user_id if case.by_creator else None, shared=case.shared
    )
    client.force_login(world.users[role])

    response = case.act(client, world)

    body = response.content.decode()
    if expected:
        assert response.status_code in case.allowed_status, body
        assert case.changed(world) is case.takes_effect
    else:
        assert response.status_code == case.refused_status, body
        assert case.says in body
        assert not case.changed(world)


def test_every_matrix_action_the_ade_offers_is_driven() -> None:
    """Resetting messages and attaching blocks have no ADE control; members, invitations and sandbox
    settings have their own tests; MCP servers and minting keys for others are not in the ADE."""
    elsewhere = {
        Action.AGENT_USE,  # reading is everywhere
        Action.AGENT_RESET_MESSAGES,
        Action.AGENT_FILE_IMPORT_AS_IS,  # tests below
        Action.BLOCK_CREATE,
        Action.MCP_SERVER_MANAGE,
        Action.SANDBOX_MANAGE,
        Action.TOOL_PIP_REQUIREMENTS,  # the ADE's tool editor has no such field: the API's tests drive it
        Action.API_KEY_MINT_FOR_OTHERS,
        Action.MEMBER_MANAGE,
        # No ADE pages yet (issue 18): the API's tests drive them.
        Action.CONVERSATION_WRITE,
        Action.GROUP_CREATE,  # the ADE's group page only shows and sends: the API's tests drive them
        Action.GROUP_WRITE,
    }
    assert {case.action for case in CASES} | elsewhere == set(Action)


# --- what a refusal leaves visible ------------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_other_peoples_keys_are_listed_only_for_owners_and_admins(
    role: str, world: World, client: Client
) -> None:
    _bystanders_key(world, role)
    client.force_login(world.users[role])

    body = client.get(reverse("ade:settings-api-keys")).content.decode()

    listed = f'data-key="{world.extra["key"].id}"' in body
    assert listed is allows(world.actors[role], Action.API_KEY_REVOKE_OTHERS)


def test_a_key_is_always_created_for_the_signed_in_user(world: World, client: Client) -> None:
    """The ADE offers no way to mint a key for someone else (API_KEY_MINT_FOR_OTHERS is /v1's and the
    admin's): a posted user is ignored, even an owner's."""
    client.force_login(world.users["owner"])

    client.post(
        reverse("ade:settings-api-keys"),
        {"name": "for them", "user": world.users["member"].id, "user_id": world.users["member"].id},
        **HTMX,
    )

    assert ApiKey.objects.unscoped().get(name="for them").user_id == world.users["owner"].id


# --- clone: everyone may, secret values only for who may configure the source ---------------------------


@pytest.mark.parametrize("role", ROLES)
def test_a_clone_has_the_secret_values_only_for_who_may_configure_the_source(
    role: str, world: World, client: Client
) -> None:
    actor = world.actors[role]
    client.force_login(world.users[role])

    response = client.post(reverse("ade:agent-clone", args=[world.agent.id]), **HTMX)

    assert response.status_code == 200, response.content
    assert allows(actor, Action.AGENT_CREATE)
    clone = Agent.objects.unscoped().get(organization_id=actor.organization_id, name="Assistant copy")
    assert clone.created_by_id == actor.user_id
    secret = AgentSecret.objects.unscoped().get(agent=clone, key="TOKEN")
    may_configure = allows(actor, Action.AGENT_CONFIGURE, creator_id=world.creator.user_id)
    assert secret.value == ("s3cret" if may_configure else "")


# --- Agent File import: a member's import lists what it left out ---------------------------------------


def _mcp_server(world: World) -> MCPServer:
    return MCPServer.objects.unscoped().create(
        organization_id=world.agent.organization_id,
        server_name="remote",
        server_type="streamable_http",
        server_url="https://mcp.example.com/mcp",
    )


def _import(client: Client, document: dict[str, Any]) -> HttpResponse:
    upload = SimpleUploadedFile("hostile.af", json.dumps(document).encode())
    data = {"file": upload, "override_existing_tools": "on"}  # as /v1's default
    return client.post(reverse("ade:agent-import"), data, **HTMX)


def test_a_members_import_through_the_ade_lists_what_it_left_out(world: World, client: Client) -> None:
    _owner_agent_uses_the_tool(world, "member")
    document = _hostile_file(_mcp_server(world))
    client.force_login(world.users["member"])

    response = _import(client, document)

    body = response.content.decode()
    assert response.status_code == 200, body
    assert 'data-testid="import-success"' in body
    assert body.count('data-testid="import-refused"') == 3
    for kind, name in (("tool", "add"), ("tool", "remote_thing"), ("message", "message-3")):
        assert f"Not imported: {kind} “{name}”" in body
    assert Tool.objects.unscoped().get(id=world.tool.id).source_code == ADD
    assert not Tool.objects.unscoped().filter(name="remote_thing").exists()


def test_an_admins_import_through_the_ade_leaves_nothing_out(world: World, client: Client) -> None:
    document = _hostile_file(_mcp_server(world))
    client.force_login(world.users["admin"])

    response = _import(client, document)

    body = response.content.decode()
    assert response.status_code == 200, body
    assert 'data-testid="import-success"' in body
    assert 'data-testid="import-refused"' not in body
    assert Tool.objects.unscoped().get(id=world.tool.id).source_code == EVIL_ADD


# --- what a page offers -------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_pages_offer_only_the_controls_the_viewer_may_use(role: str, world: World, client: Client) -> None:
    _pending_approval(world, role)
    _owner_agent_uses_the_tool(world, role)
    client.force_login(world.users[role])
    actor = world.actors[role]
    creator = world.creator.user_id
    careful = world.extra["careful"]

    agent_list = client.get(reverse("ade:agent-list")).content.decode()
    workspace = client.get(reverse("ade:workspace", args=[careful.id])).content.decode()
    tool_page = client.get(reverse("ade:tool-detail", args=[world.tool.id])).content.decode()

    assert ('data-testid="delete-agent"' in agent_list) is allows(
        actor, Action.AGENT_DELETE, creator_id=creator
    )
    may_configure = allows(actor, Action.AGENT_CONFIGURE, creator_id=creator)
    assert ('data-testid="read-only-agent"' in workspace) is not may_configure
    may_decide = allows(actor, Action.APPROVAL_RESPOND, creator_id=creator)
    assert ('data-testid="approve"' in workspace) is may_decide
    assert ('data-testid="approval-not-yours"' in workspace) is not may_decide
    # The owner's agent uses the creator's tool now: only owners and admins may change it.
    may_write_tool = allows(actor, Action.TOOL_WRITE, creator_id=creator, shared=True)
    assert ('data-testid="save-tool"' in tool_page) is may_write_tool
    assert ('data-testid="tool-read-only"' in tool_page) is not may_write_tool
