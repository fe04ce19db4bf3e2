"""Writes to identities: create, upsert, modify (with Letta's merge rules), properties, delete, and linking
identities to agents and blocks.

Who may: the role matrix's IDENTITY_CREATE to create (an upsert that creates), IDENTITY_WRITE on the identity
for everything else; linking or unlinking an agent also needs AGENT_CONFIGURE on that agent, a block
BLOCK_WRITE on that block. Another organisation's identity, agent or block is not found (404), never refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from apps.agents.errors import AgentNotFound
from apps.agents.models import Agent
from apps.agents.services import require_agent_permission
from apps.core import permissions
from apps.core.actor import Actor
from apps.core.errors import InvalidInput
from apps.core.permissions import Action
from apps.identities.errors import DuplicateIdentity, IdentityNotFound
from apps.identities.models import Identity, IdentityType, PropertyType
from apps.identities.selectors import AgentLink, BlockLink, identity_get
from apps.memory.errors import BlockNotFound
from apps.memory.models import Block

MAX_KEY_LENGTH = 255  # Identity.identifier_key, Identity.name

PropertyValue = str | int | float | bool | dict[str, Any]


@dataclass(frozen=True, slots=True)
class IdentityProperty:
    """One entry of Identity.properties (Letta's IdentityProperty). `type` says how the app reads `value`;
    as in Letta, the two are not cross-checked."""

    key: str
    value: PropertyValue
    type: str

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise InvalidInput("A property's key must be a non-empty string")
        if self.type not in PropertyType.values:
            raise InvalidInput(f"A property's type must be one of {', '.join(PropertyType.values)}")
        if not isinstance(self.value, str | int | float | bool | dict):
            raise InvalidInput("A property's value must be a string, a number, a boolean or an object")

    @classmethod
    def from_json(cls, raw: Any) -> IdentityProperty:
        """Raises InvalidInput for anything but {key, value, type}."""
        if not isinstance(raw, dict) or set(raw) != {"key", "value", "type"}:
            raise InvalidInput("A property is an object with exactly key, value and type")
        return cls(key=raw["key"], value=raw["value"], type=raw["type"])

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "type": self.type}


def parse_properties(raw: Any) -> list[IdentityProperty]:
    """Stored or submitted JSON (the admin's field) as properties. Raises InvalidInput."""
    if not isinstance(raw, list):
        raise InvalidInput("Properties are a list of {key, value, type} objects")
    return [IdentityProperty.from_json(item) for item in raw]


def _properties_json(properties: Iterable[IdentityProperty], *, over: list[Any] | None = None) -> list[Any]:
    """One entry per key: later entries replace earlier ones in place (Letta's merge), new keys come last."""
    by_key: dict[str, dict[str, Any]] = {item["key"]: item for item in over or []}
    for prop in properties:
        by_key[prop.key] = prop.as_json()
    return list(by_key.values())


def _clean_fields(*, identifier_key: str | None, name: str | None, identity_type: str | None) -> None:
    if identifier_key is not None and not (0 < len(identifier_key) <= MAX_KEY_LENGTH):
        raise InvalidInput(f"identifier_key must be 1 to {MAX_KEY_LENGTH} characters")
    if name is not None and not (0 < len(name) <= MAX_KEY_LENGTH):
        raise InvalidInput(f"name must be 1 to {MAX_KEY_LENGTH} characters")
    if identity_type is not None and identity_type not in IdentityType.values:
        raise InvalidInput(f"identity_type must be one of {', '.join(IdentityType.values)}")


def require_identity_writer(actor: Actor, identity: Identity) -> None:
    """The role matrix's IDENTITY_WRITE: the identity's creator, owners and admins. Raises PermissionDenied."""
    permissions.require(
        actor, Action.IDENTITY_WRITE, creator_id=identity.created_by_id, subject=f"identity '{identity.name}'"
    )


def _require_block_writer(actor: Actor, block: Block) -> None:
    permissions.require(
        actor, Action.BLOCK_WRITE, creator_id=block.created_by_id, subject=f"block '{block.label}'"
    )


def _agents(actor: Actor, agent_ids: Sequence[str]) -> list[Agent]:
    """The actor's agents with these ids, in the given order. Raises AgentNotFound for the first unknown."""
    found = {agent.id: agent for agent in Agent.objects.for_actor(actor).filter(id__in=list(agent_ids))}
    for agent_id in agent_ids:
        if agent_id not in found:
            raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    return [found[agent_id] for agent_id in dict.fromkeys(agent_ids)]


def _blocks(actor: Actor, block_ids: Sequence[str]) -> list[Block]:
    """The actor's blocks with these ids, in the given order. Raises BlockNotFound for the first unknown."""
    found = {block.id: block for block in Block.objects.for_actor(actor).filter(id__in=list(block_ids))}
    for block_id in block_ids:
        if block_id not in found:
            raise BlockNotFound(f"Block with id '{block_id}' not found")
    return [found[block_id] for block_id in dict.fromkeys(block_ids)]


def _link_agents(actor: Actor, identity: Identity, agent_ids: Sequence[str], *, replace: bool) -> None:
    """Add the agents (and, with `replace`, remove the linked ones not named). Each agent added or removed
    must be the actor's to configure."""
    wanted = _agents(actor, agent_ids)
    current = set(AgentLink.objects.filter(identity_id=identity.id).values_list("agent_id", flat=True))
    added = [agent for agent in wanted if agent.id not in current]
    removed_ids = current - {agent.id for agent in wanted} if replace else set()
    removed = list(Agent.objects.for_actor(actor).filter(id__in=removed_ids))
    for agent in [*added, *removed]:
        require_agent_permission(actor, agent)
    if removed_ids:
        AgentLink.objects.filter(identity_id=identity.id, agent_id__in=removed_ids).delete()
    AgentLink.objects.bulk_create(
        [AgentLink(identity_id=identity.id, agent_id=agent.id) for agent in added], ignore_conflicts=True
    )


def _link_blocks(actor: Actor, identity: Identity, block_ids: Sequence[str], *, replace: bool) -> None:
    """As _link_agents, for blocks: each block added or removed must be the actor's to write."""
    wanted = _blocks(actor, block_ids)
    current = set(BlockLink.objects.filter(identity_id=identity.id).values_list("block_id", flat=True))
    added = [block for block in wanted if block.id not in current]
    removed_ids = current - {block.id for block in wanted} if replace else set()
    removed = list(Block.objects.for_actor(actor).filter(id__in=removed_ids))
    for block in [*added, *removed]:
        _require_block_writer(actor, block)
    if removed_ids:
        BlockLink.objects.filter(identity_id=identity.id, block_id__in=removed_ids).delete()
    BlockLink.objects.bulk_create(
        [BlockLink(identity_id=identity.id, block_id=block.id) for block in added], ignore_conflicts=True
    )


def _save(identity: Identity, **kwargs: Any) -> None:
    """Save in a savepoint; a taken identifier_key is DuplicateIdentity (409), whoever got there first."""
    try:
        with transaction.atomic():
            identity.save(**kwargs)
    except IntegrityError as exc:
        if "identity_unique_key_per_organization" not in str(exc):
            raise
        raise DuplicateIdentity(
            f"An identity with identifier_key '{identity.identifier_key}' already exists in this organization"
        ) from exc


def _lock_identity(*, actor: Actor, identity_id: str) -> Identity:
    identity = Identity.objects.for_actor(actor).select_for_update().filter(id=identity_id).first()
    if identity is None:
        raise IdentityNotFound(f"Identity with id '{identity_id}' not found")
    return identity


@transaction.atomic
def identity_create(
    *,
    actor: Actor,
    identifier_key: str,
    name: str,
    identity_type: str,
    project_id: str | None = None,
    agent_ids: Sequence[str] | None = None,
    block_ids: Sequence[str] | None = None,
    properties: Sequence[IdentityProperty] | None = None,
) -> Identity:
    """Create an identity owned by the actor, linked to these agents and blocks. Raises PermissionDenied
    (IDENTITY_CREATE; AGENT_CONFIGURE / BLOCK_WRITE on what it links), DuplicateIdentity (the key is taken),
    AgentNotFound, BlockNotFound, InvalidInput."""
    permissions.require(actor, Action.IDENTITY_CREATE)
    _clean_fields(identifier_key=identifier_key, name=name, identity_type=identity_type)
    identity = Identity(
        organization_id=actor.organization_id,
        identifier_key=identifier_key,
        name=name,
        identity_type=identity_type,
        project_id=project_id or "",
        properties=_properties_json(properties or []),
        created_by_id=actor.user_id,
    )
    _save(identity, force_insert=True)
    _link_agents(actor, identity, agent_ids or [], replace=True)
    _link_blocks(actor, identity, block_ids or [], replace=True)
    return identity_get(actor=actor, identity_id=identity.id)


def _update(
    actor: Actor,
    identity: Identity,
    *,
    identifier_key: str | None,
    name: str | None,
    identity_type: str | None,
    agent_ids: Sequence[str] | None,
    block_ids: Sequence[str] | None,
    properties: Sequence[IdentityProperty] | None,
    replace: bool,
    project_id: str | None = None,
) -> Identity:
    """Letta's update rules: None leaves a field as it is; without `replace` (a PATCH) properties are merged
    by key and agents and blocks are added to the linked ones; with it (an upsert) both are replaced."""
    require_identity_writer(actor, identity)
    _clean_fields(identifier_key=identifier_key, name=name, identity_type=identity_type)
    if identifier_key is not None:
        identity.identifier_key = identifier_key
    if name is not None:
        identity.name = name
    if identity_type is not None:
        identity.identity_type = identity_type
    if project_id is not None:
        identity.project_id = project_id
    if properties is not None:
        identity.properties = _properties_json(properties, over=None if replace else identity.properties)
    _save(identity)
    if agent_ids is not None:
        _link_agents(actor, identity, agent_ids, replace=replace)
    if block_ids is not None:
        _link_blocks(actor, identity, block_ids, replace=replace)
    return identity_get(actor=actor, identity_id=identity.id)


@transaction.atomic
def identity_update(
    *,
    actor: Actor,
    identity_id: str,
    identifier_key: str | None = None,
    name: str | None = None,
    identity_type: str | None = None,
    agent_ids: Sequence[str] | None = None,
    block_ids: Sequence[str] | None = None,
    properties: Sequence[IdentityProperty] | None = None,
    replace: bool = False,
    project_id: str | None = None,
) -> Identity:
    """Modify an identity: Letta's PATCH merges properties by key and adds agents and blocks; `replace`
    replaces them (the admin's form). None leaves a field as it is; `project_id` is the admin's (Letta's
    PATCH has none), "" clears it. Raises IdentityNotFound, PermissionDenied (IDENTITY_WRITE; AGENT_CONFIGURE
    / BLOCK_WRITE on what is linked or unlinked), DuplicateIdentity, AgentNotFound, BlockNotFound,
    InvalidInput."""
    identity = _lock_identity(actor=actor, identity_id=identity_id)
    return _update(
        actor,
        identity,
        identifier_key=identifier_key,
        name=name,
        identity_type=identity_type,
        agent_ids=agent_ids,
        block_ids=block_ids,
        properties=properties,
        replace=replace,
        project_id=project_id,
    )


def identity_upsert(
    *,
    actor: Actor,
    identifier_key: str,
    name: str,
    identity_type: str,
    project_id: str | None = None,
    agent_ids: Sequence[str] | None = None,
    block_ids: Sequence[str] | None = None,
    properties: Sequence[IdentityProperty] | None = None,
) -> Identity:
    """Create the identity with this identifier_key, or replace the stored one's name, type, properties,
    agents and blocks (those given; its project stays). Creating needs IDENTITY_CREATE, replacing
    IDENTITY_WRITE on the stored one. Raises as identity_create and identity_update."""
    with transaction.atomic():
        existing = (
            Identity.objects.for_actor(actor)
            .select_for_update()
            .filter(identifier_key=identifier_key)
            .first()
        )
        if existing is None:
            try:
                return identity_create(
                    actor=actor,
                    identifier_key=identifier_key,
                    name=name,
                    identity_type=identity_type,
                    project_id=project_id,
                    agent_ids=agent_ids,
                    block_ids=block_ids,
                    properties=properties,
                )
            except DuplicateIdentity:
                pass  # a concurrent upsert created it first: replace that one below
    with transaction.atomic():
        identity = Identity.objects.for_actor(actor).select_for_update().get(identifier_key=identifier_key)
        return _update(
            actor,
            identity,
            identifier_key=None,
            name=name,
            identity_type=identity_type,
            agent_ids=agent_ids,
            block_ids=block_ids,
            properties=properties,
            replace=True,
        )


@transaction.atomic
def identity_properties_set(
    *, actor: Actor, identity_id: str, properties: Sequence[IdentityProperty]
) -> Identity:
    """Replace the identity's properties (one per key, the last given wins). Raises IdentityNotFound,
    PermissionDenied (IDENTITY_WRITE), InvalidInput."""
    identity = _lock_identity(actor=actor, identity_id=identity_id)
    require_identity_writer(actor, identity)
    identity.properties = _properties_json(properties)
    identity.save(update_fields=["properties", "updated_at"])
    return identity_get(actor=actor, identity_id=identity.id)


@transaction.atomic
def identity_delete(*, actor: Actor, identity_id: str) -> None:
    """Delete the identity; its agents and blocks stay, unlinked. Raises IdentityNotFound, PermissionDenied
    (IDENTITY_WRITE)."""
    identity = _lock_identity(actor=actor, identity_id=identity_id)
    require_identity_writer(actor, identity)
    identity.delete()


def _agent_row(*, actor: Actor, agent_id: str) -> Agent:
    agent = Agent.objects.for_actor(actor).filter(id=agent_id).first()
    if agent is None:
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    return agent


@transaction.atomic
def identity_attach_agent(*, actor: Actor, identity_id: str, agent_id: str) -> None:
    """Link the identity to the agent; linking twice is a no-op. Raises AgentNotFound, IdentityNotFound,
    PermissionDenied (AGENT_CONFIGURE on the agent, IDENTITY_WRITE on the identity)."""
    agent = _agent_row(actor=actor, agent_id=agent_id)
    identity = _lock_identity(actor=actor, identity_id=identity_id)
    require_agent_permission(actor, agent)
    require_identity_writer(actor, identity)
    AgentLink.objects.get_or_create(identity_id=identity.id, agent_id=agent.id)


@transaction.atomic
def identity_detach_agent(*, actor: Actor, identity_id: str, agent_id: str) -> None:
    """Unlink the identity from the agent; one that is not linked is a no-op (as in Letta). Raises as
    identity_attach_agent."""
    agent = _agent_row(actor=actor, agent_id=agent_id)
    identity = _lock_identity(actor=actor, identity_id=identity_id)
    require_agent_permission(actor, agent)
    require_identity_writer(actor, identity)
    AgentLink.objects.filter(identity_id=identity.id, agent_id=agent.id).delete()


def _block_row(*, actor: Actor, block_id: str) -> Block:
    block = Block.objects.for_actor(actor).filter(id=block_id).first()
    if block is None:
        raise BlockNotFound(f"Block with id '{block_id}' not found")
    return block


@transaction.atomic
def identity_attach_block(*, actor: Actor, identity_id: str, block_id: str) -> Block:
    """Link the identity to the block (an identity-scoped block); linking twice is a no-op. Raises
    BlockNotFound, IdentityNotFound, PermissionDenied (BLOCK_WRITE on the block, IDENTITY_WRITE)."""
    block = _block_row(actor=actor, block_id=block_id)
    identity = _lock_identity(actor=actor, identity_id=identity_id)
    _require_block_writer(actor, block)
    require_identity_writer(actor, identity)
    BlockLink.objects.get_or_create(identity_id=identity.id, block_id=block.id)
    return block


@transaction.atomic
def identity_detach_block(*, actor: Actor, identity_id: str, block_id: str) -> Block:
    """Unlink the identity from the block; one that is not linked is a no-op. Raises as
    identity_attach_block."""
    block = _block_row(actor=actor, block_id=block_id)
    identity = _lock_identity(actor=actor, identity_id=identity_id)
    _require_block_writer(actor, block)
    require_identity_writer(actor, identity)
    BlockLink.objects.filter(identity_id=identity.id, block_id=block.id).delete()
    return block


@transaction.atomic
def agent_identities_set(*, actor: Actor, agent_id: str, identity_ids: Sequence[str]) -> None:
    """Make these exactly the agent's identities (CreateAgent's and UpdateAgent's `identity_ids`). Raises
    AgentNotFound, IdentityNotFound, PermissionDenied (AGENT_CONFIGURE on the agent, IDENTITY_WRITE on each
    identity linked or unlinked)."""
    agent = _agent_row(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent)
    wanted_ids = list(dict.fromkeys(identity_ids))
    found = {i.id: i for i in Identity.objects.for_actor(actor).filter(id__in=wanted_ids)}
    for identity_id in wanted_ids:
        if identity_id not in found:
            raise IdentityNotFound(f"Identity with id '{identity_id}' not found")
    current = set(AgentLink.objects.filter(agent_id=agent.id).values_list("identity_id", flat=True))
    added = [found[i] for i in wanted_ids if i not in current]
    removed = list(Identity.objects.for_actor(actor).filter(id__in=current - set(wanted_ids)))
    for identity in [*added, *removed]:
        require_identity_writer(actor, identity)
    AgentLink.objects.filter(agent_id=agent.id, identity_id__in=[i.id for i in removed]).delete()
    AgentLink.objects.bulk_create(
        [AgentLink(identity_id=identity.id, agent_id=agent.id) for identity in added], ignore_conflicts=True
    )
