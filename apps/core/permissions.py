"""The role matrix: who may do what in an organisation, written once.

Services call `require(actor, Action.X, creator_id=...)` before they change anything, so the /v1 API,
the ADE, the Django admin and agent-file import decide the same way. Pure code: no database, no
request; the README's role table is rendered from `MATRIX` (a test keeps the two equal).

The baseline: members create and manage their own agents, blocks and tools; what the whole
organisation depends on (tools other people's agents use, MCP servers, providers, sandbox settings,
approval rules on agents they did not create, members, other people's keys) is for owners and admins.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from apps.core.actor import Actor, Role
from apps.core.errors import PermissionDenied


class Who(StrEnum):
    EVERYONE = "everyone"  # every member of the organisation
    CREATOR_OR_ADMIN = "creator, admin, owner"  # the object's creator, or an owner or admin
    ADMIN = "admin, owner"
    OWNER = "owner"


class Action(StrEnum):
    # Agents. "use" is reading and talking to an agent; "configure" is everything that changes how it
    # behaves or what it remembers (model, prompt, tools, tool rules, approvals, secrets, memory).
    AGENT_CREATE = "agent.create"
    AGENT_USE = "agent.use"
    AGENT_CONFIGURE = "agent.configure"
    AGENT_DELETE = "agent.delete"
    AGENT_FILE_IMPORT_AS_IS = "agent.import_as_is"
    AGENT_RESET_MESSAGES = "agent.reset_messages"
    APPROVAL_RESPOND = "agent.approval.respond"
    # Groups of agents (Letta's multi-agent groups); sending to one is using its agents (AGENT_USE).
    GROUP_CREATE = "group.create"
    GROUP_WRITE = "group.write"
    # Conversations: their creator's, the agent's creator's, an owner's or an admin's.
    CONVERSATION_WRITE = "conversation.write"
    # Archives and folders (memory and documents agents can share), identities (an app's end users).
    ARCHIVE_CREATE = "archive.create"
    ARCHIVE_WRITE = "archive.write"
    IDENTITY_CREATE = "identity.create"
    IDENTITY_WRITE = "identity.write"
    # Memory blocks, standalone or through an agent (an attached block is shared by its agents).
    BLOCK_CREATE = "block.create"
    BLOCK_WRITE = "block.write"
    # Tools: a tool that someone else's agent uses is the organisation's (see tool_writer_who).
    TOOL_CREATE = "tool.create"
    TOOL_WRITE = "tool.write"
    TOOL_RUN_CODE = "tool.run_code"
    TOOL_PIP_REQUIREMENTS = "tool.pip_requirements"
    MCP_SERVER_MANAGE = "mcp_server.manage"
    PROVIDER_MANAGE = "provider.manage"
    SANDBOX_MANAGE = "sandbox.manage"
    # Runs and steps of agents the caller may use.
    RUN_CANCEL = "run.cancel"
    STEP_FEEDBACK = "step.feedback"
    # Keys and people.
    API_KEY_OWN = "api_key.own"
    API_KEY_REVOKE_OTHERS = "api_key.revoke_others"
    API_KEY_MINT_FOR_OTHERS = "api_key.mint_for_others"
    MEMBER_MANAGE = "member.manage"


@dataclass(frozen=True, slots=True)
class Rule:
    who: Who
    what: str  # the operations this covers, for the README table and refusals


MATRIX: dict[Action, Rule] = {
    Action.AGENT_CREATE: Rule(Who.EVERYONE, "create an agent, import an agent file"),
    Action.AGENT_USE: Rule(
        Who.EVERYONE,
        "read an agent, send messages, open conversations, search its memory, recompile its prompt, export it",
    ),
    Action.AGENT_CONFIGURE: Rule(
        Who.CREATOR_OR_ADMIN,
        "modify an agent (model, prompt, tags, tool rules, secrets), attach or detach tools and blocks, "
        "switch tool approvals, insert or delete archival passages, compact its messages, run its tools "
        "by hand",
    ),
    Action.AGENT_DELETE: Rule(Who.CREATOR_OR_ADMIN, "delete an agent"),
    Action.AGENT_FILE_IMPORT_AS_IS: Rule(
        Who.ADMIN,
        "import an agent file with its MCP-bound tools and a pending approval (others' imports leave "
        "them out and list them)",
    ),
    Action.AGENT_RESET_MESSAGES: Rule(Who.CREATOR_OR_ADMIN, "reset an agent's messages"),
    Action.APPROVAL_RESPOND: Rule(Who.CREATOR_OR_ADMIN, "approve or deny a tool call the agent asked to run"),
    Action.GROUP_CREATE: Rule(Who.EVERYONE, "create a group of agents, send messages to a group"),
    Action.GROUP_WRITE: Rule(Who.CREATOR_OR_ADMIN, "modify or delete a group, reset its messages"),
    Action.CONVERSATION_WRITE: Rule(
        Who.CREATOR_OR_ADMIN,
        "rename, delete, fork or compact a conversation (its creator or the agent's creator)",
    ),
    Action.ARCHIVE_CREATE: Rule(Who.EVERYONE, "create an archive or a folder"),
    Action.ARCHIVE_WRITE: Rule(
        Who.CREATOR_OR_ADMIN,
        "modify or delete an archive or a folder, attach or detach it, add or delete its passages or files",
    ),
    Action.IDENTITY_CREATE: Rule(Who.EVERYONE, "create or upsert an identity"),
    Action.IDENTITY_WRITE: Rule(
        Who.CREATOR_OR_ADMIN, "modify or delete an identity, attach or detach it, change its properties"
    ),
    Action.BLOCK_CREATE: Rule(Who.EVERYONE, "create a block"),
    Action.BLOCK_WRITE: Rule(Who.CREATOR_OR_ADMIN, "modify or delete a block, attach it to an agent"),
    Action.TOOL_CREATE: Rule(Who.EVERYONE, "create a tool under a new name"),
    Action.TOOL_WRITE: Rule(
        Who.CREATOR_OR_ADMIN,
        "modify, upsert or delete a tool, change its default approval; once an agent someone else "
        "created uses it, owners and admins only",
    ),
    Action.TOOL_RUN_CODE: Rule(Who.ADMIN, "run arbitrary tool code (/v1/tools/run, the ADE's tool runner)"),
    Action.TOOL_PIP_REQUIREMENTS: Rule(
        Who.ADMIN, "give a tool pip requirements (packages built into the organisation's sandbox images)"
    ),
    Action.MCP_SERVER_MANAGE: Rule(
        Who.ADMIN, "add, modify, refresh or delete MCP servers, list their tools live, add or run their tools"
    ),
    Action.PROVIDER_MANAGE: Rule(Who.ADMIN, "add or delete LLM providers (BYOK keys)"),
    Action.SANDBOX_MANAGE: Rule(Who.ADMIN, "change sandbox configurations and sandbox variables"),
    Action.RUN_CANCEL: Rule(Who.EVERYONE, "cancel a run of an agent they may use"),
    Action.STEP_FEEDBACK: Rule(Who.EVERYONE, "give feedback on a step"),
    Action.API_KEY_OWN: Rule(Who.EVERYONE, "create, list and revoke their own API keys"),
    Action.API_KEY_REVOKE_OTHERS: Rule(Who.ADMIN, "list and revoke other people's API keys"),
    Action.API_KEY_MINT_FOR_OTHERS: Rule(Who.OWNER, "create an API key for someone else"),
    Action.MEMBER_MANAGE: Rule(Who.OWNER, "invite, add or remove members, change roles"),
}

_ROLES: dict[Who, frozenset[Role]] = {
    Who.EVERYONE: frozenset({Role.OWNER, Role.ADMIN, Role.MEMBER, Role.SYSTEM}),
    Who.CREATOR_OR_ADMIN: frozenset({Role.OWNER, Role.ADMIN, Role.SYSTEM}),
    Who.ADMIN: frozenset({Role.OWNER, Role.ADMIN, Role.SYSTEM}),
    Who.OWNER: frozenset({Role.OWNER, Role.SYSTEM}),
}

_REFUSALS: dict[Who, str] = {
    Who.CREATOR_OR_ADMIN: "only its creator, an owner or an admin may",
    Who.ADMIN: "only owners and admins may",
    Who.OWNER: "only owners may",
}


Creators = str | Collection[str | None] | None


def allows(actor: Actor, action: Action, *, creator_id: Creators = None, shared: bool = False) -> bool:
    """May `actor` do `action` on an object created by `creator_id` (one user id, or several: a
    conversation is its creator's and its agent's creator's)?

    `shared` marks an object that other people's agents depend on (a tool attached to an agent
    someone else created): its creator then counts as an ordinary member."""
    who = MATRIX[action].who
    if actor.role in _ROLES[who]:
        return True
    creators = (creator_id,) if creator_id is None or isinstance(creator_id, str) else creator_id
    return (
        who is Who.CREATOR_OR_ADMIN and not shared and actor.user_id is not None and actor.user_id in creators
    )


def require(
    actor: Actor,
    action: Action,
    *,
    creator_id: Creators = None,
    shared: bool = False,
    subject: str = "",
) -> None:
    """Raise PermissionDenied (403 in the API, with this reason) unless `allows`. `subject` names the
    object in the message ("this agent", "tool 'x'")."""
    if allows(actor, action, creator_id=creator_id, shared=shared):
        return
    rule = MATRIX[action]
    reason = _REFUSALS[rule.who]
    if shared and rule.who is Who.CREATOR_OR_ADMIN:
        reason = "other people's agents use it, so only an owner or an admin may"
    target = f" ({subject})" if subject else ""
    raise PermissionDenied(f"Not allowed{target}: {reason} {rule.what}.")


def matrix_table() -> str:
    """The README's role table, rendered from MATRIX."""
    mark = {True: "yes", False: "—"}
    lines = [
        "| Operation | owner | admin | member (creator) | member |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rule in MATRIX.values():
        roles = _ROLES[rule.who]
        creator = rule.who is Who.CREATOR_OR_ADMIN or Role.MEMBER in roles
        cells = [Role.OWNER in roles, Role.ADMIN in roles, creator, Role.MEMBER in roles]
        lines.append(f"| {rule.what} | " + " | ".join(mark[c] for c in cells) + " |")
    return "\n".join(lines)
