"""Wire shapes of agents (AgentState, CreateAgent, UpdateAgent), their tools, and the model catalogue.

AgentState is rendered from prefetched agents plus one batch of model descriptions (`agent_states`), so
a list costs the same number of queries whatever its length.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable, Iterable
from functools import cached_property
from typing import Any, cast

from django.conf import settings
from django.utils import timezone as django_timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import ISO_8601, serializers
from rest_framework.settings import api_settings

from apps.agents import selectors as agent_selectors
from apps.agents.models import Agent, AgentType, StopReason
from apps.agents.services import BlockSpec
from apps.agents.wire import to_letta_messages, with_thread_system_message
from apps.api.serializers.common import BlockOut, validated_query
from apps.api.serializers.folders import FolderOut
from apps.api.serializers.identities import IdentityOut
from apps.api.serializers.messages import _message_create
from apps.api.serializers.strict import CLOUD_ONLY, REASONING_IN_SETTINGS, refuse_unsupported
from apps.api.serializers.tools import ToolResponse
from apps.core.actor import Actor
from apps.folders.selectors import FileLimits, file_limits_by_agent, files_of_agents
from apps.identities.selectors import identity_ids_by_agent, identity_queryset
from apps.llm.selectors import DEFAULT_CONTEXT_WINDOW, endpoint_for_tenants
from apps.tools.services import MULTI_AGENT_TOOLS

AGENT_TYPES = [t.value for t in AgentType]


# --- Output ----------------------------------------------------------------------------------------------


class LlmConfigOut(serializers.Serializer):
    model = serializers.CharField()
    model_endpoint_type = serializers.CharField()
    model_endpoint = serializers.CharField(allow_null=True)
    provider_name = serializers.CharField(allow_null=True)
    provider_category = serializers.CharField(allow_null=True)
    context_window = serializers.IntegerField()
    handle = serializers.CharField(allow_null=True)
    temperature = serializers.FloatField()
    max_tokens = serializers.IntegerField(allow_null=True)
    parallel_tool_calls = serializers.BooleanField()
    put_inner_thoughts_in_kwargs = serializers.BooleanField()
    enable_reasoner = serializers.BooleanField()


class EmbeddingConfigOut(serializers.Serializer):
    embedding_model = serializers.CharField()
    embedding_endpoint_type = serializers.CharField()
    embedding_endpoint = serializers.CharField(allow_null=True)
    embedding_dim = serializers.IntegerField(allow_null=True)
    embedding_chunk_size = serializers.IntegerField(allow_null=True)
    handle = serializers.CharField()


class SecretOut(serializers.Serializer):
    """An agent secret's key. The value is never returned (always null), as in the admin."""

    id = serializers.CharField()
    agent_id = serializers.CharField()
    key = serializers.CharField()
    value = serializers.SerializerMethodField()
    description = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_value(self, secret: Any) -> None:
        return None


class FileBlockOut(BlockOut):
    """Letta's FileBlock: an attached file as a read-only block (`memory.file_blocks`)."""

    file_id = serializers.CharField()
    source_id = serializers.CharField()
    is_open = serializers.BooleanField()
    last_accessed_at = serializers.DateTimeField(allow_null=True)


class MemoryOut(serializers.Serializer):
    """Letta's deprecated `memory` object: the same blocks as AgentState.blocks."""

    blocks = BlockOut(many=True)
    file_blocks = FileBlockOut(many=True)
    prompt_template = serializers.CharField()
    agent_type = serializers.CharField()


def llm_config(agent: Agent, info: agent_selectors.ChatModelInfo | None) -> dict[str, Any]:
    model = info.name if info else agent.model
    return {
        "model": model,
        "model_endpoint_type": info.endpoint_type if info else "openai",
        "model_endpoint": endpoint_for_tenants(info.endpoint) if info else None,
        "provider_name": info.provider_name if info else None,
        "provider_category": info.provider_category if info else None,
        "context_window": agent.context_window_limit
        or (info.context_window if info else DEFAULT_CONTEXT_WINDOW),
        "handle": agent.model or None,
        "temperature": agent.temperature,
        "max_tokens": agent.max_tokens,
        "parallel_tool_calls": agent.parallel_tool_calls,
        "put_inner_thoughts_in_kwargs": False,
        "enable_reasoner": False,
        **{k: v for k, v in agent.model_settings.items() if k in ("reasoning_effort", "response_format")},
    }


def embedding_config(agent: Agent, info: agent_selectors.EmbeddingModelInfo | None) -> dict[str, Any] | None:
    if info is None:
        return None
    return {
        "embedding_model": info.name,
        "embedding_endpoint_type": info.endpoint_type,
        "embedding_endpoint": endpoint_for_tenants(info.endpoint),
        "embedding_dim": agent.embedding_dim or info.dimension,
        "embedding_chunk_size": None,
        "handle": info.handle,
    }


def model_settings(agent: Agent, info: agent_selectors.ChatModelInfo | None) -> dict[str, Any]:
    """Letta's discriminated model_settings: the provider's type, the common knobs, the stored extras."""
    return {
        "provider_type": info.provider_type if info else "openai",
        "temperature": agent.temperature,
        "max_output_tokens": agent.max_tokens,
        "parallel_tool_calls": agent.parallel_tool_calls,
        **agent.model_settings,
    }


SLEEPTIME_GROUP_NAMESPACE = uuid.UUID("6f0d2b4e-3c1a-4f7e-9a51-2d8c7b0e9f13")


def sleeptime_group(agent: Agent) -> dict[str, Any] | None:
    """Letta's sleeptime Group of a primary agent (manager: the primary; member: its sleeptime agent),
    drawn from the agent's own columns; its id is stable for the agent. None without sleeptime."""
    if not agent.sleeptime_agent_id:
        return None
    return {
        "id": f"group-{uuid.uuid5(SLEEPTIME_GROUP_NAMESPACE, agent.id)}",
        "manager_type": "sleeptime",
        "agent_ids": [agent.sleeptime_agent_id],
        "description": f"Sleeptime memory management for {agent.name}",
        "project_id": None,
        "template_id": None,
        "base_template_id": None,
        "deployment_id": None,
        "shared_block_ids": [],
        "manager_agent_id": agent.id,
        "termination_token": None,
        "max_turns": None,
        "sleeptime_agent_frequency": agent.sleeptime_agent_frequency,
        "turns_counter": agent.sleeptime_turns_counter,
        "last_processed_message_id": None,
        "max_message_buffer_length": None,
        "min_message_buffer_length": None,
        "hidden": False,
    }


class Nested:
    """The objects nested in one response's AgentStates (blocks, tools, secrets, folders), rendered with one
    serializer instance per shape, and each row once however many agents hold it. A serializer instance
    deep-copies all its fields when first used, and a list page made a few for each agent: that copying
    and rendering the same base tools fifty times were most of GET /v1/agents' time (bench/scale_bench.py).
    Rendered rows are shared between the agents of a response: never mutate them."""

    def __init__(self) -> None:
        self._serializers: dict[type[serializers.Serializer], serializers.Serializer] = {}
        self._rendered: dict[tuple[Any, Any], Any] = {}

    def each(
        self,
        shape: type[serializers.Serializer],
        items: Iterable[Any],
        *,
        key: Callable[[Any], Any] | None = None,
    ) -> list[Any]:
        """`items` rendered by `shape`; with `key`, an item already rendered under the same key is reused."""
        serializer = self._serializers.get(shape)
        if serializer is None:
            serializer = self._serializers[shape] = shape()
        if key is None:
            return [serializer.to_representation(item) for item in items]
        out = []
        for item in items:
            cache_key = (shape, key(item))
            if cache_key not in self._rendered:
                self._rendered[cache_key] = serializer.to_representation(item)
            out.append(self._rendered[cache_key])
        return out

    def of(
        self, agent: Agent, name: str, shape: type[serializers.Serializer], items: Callable[[], Iterable[Any]]
    ) -> list[Any]:
        """The agent's `name` (rendered by `shape`), once however many fields show it."""
        cache_key = (agent.id, name)
        if cache_key not in self._rendered:
            self._rendered[cache_key] = self.each(shape, items())
        return self._rendered[cache_key]


INCLUDE_CHOICES = sorted(f"agent.{name}" for name in agent_selectors.AGENT_RELATIONSHIPS)
LEGACY_RELATIONSHIPS = {
    "tags": {"tags"},
    "memory": {"blocks", "tags"},
    "tools": {"tools"},
    "sources": {"sources"},
    "identity_ids": {"identities"},
    "multi_agent_group": {"managed_group"},
    "tool_exec_environment_variables": {"secrets"},
    "secrets": {"secrets"},
}
"""The deprecated `include_relationships` names Letta acts on, and what each loads; it ignores others."""
LEGACY_DEFAULT = frozenset(name for names in LEGACY_RELATIONSHIPS.values() for name in names)
"""Every relationship but the pending approval: what a pre-1.0 client's list or retrieve that names nothing
gets, and what every other AgentState answer (create, update, attach) carries, as on Letta."""


class AgentIncludeIn(serializers.Serializer):
    """`include` (repeated: `?include=agent.blocks&include=agent.tools`) and the deprecated
    `include_relationships` of the AgentState lists and GET /v1/agents/{id}."""

    include = serializers.ListField(child=serializers.ChoiceField(choices=INCLUDE_CHOICES), required=False)
    include_relationships = serializers.ListField(child=serializers.CharField(), required=False)


def requested_relationships(query: Any, *, legacy_client: bool) -> frozenset[str]:
    """The relationships an AgentState response carries (agent_selectors.AGENT_RELATIONSHIPS), as Letta
    decides them: what `include` names (`agent.blocks` also loads the tags), plus what
    `include_relationships` names; a `legacy_client` (a pre-1.0 SDK, api.views.agents.is_sdk_v1) that
    names no `include_relationships` gets LEGACY_DEFAULT. An unknown `include` value is a 422 naming it."""
    data = validated_query(AgentIncludeIn, query)
    included = {value.removeprefix("agent.") for value in data.get("include", [])}
    if "blocks" in included:
        included.add("tags")
    legacy = data.get("include_relationships")
    if legacy:
        for name in legacy:
            included |= LEGACY_RELATIONSHIPS.get(name, set())
    elif legacy_client:
        included |= LEGACY_DEFAULT
    return frozenset(included)


class AgentStateOut(serializers.Serializer):
    """Letta's AgentState. The relationships (blocks, tools, folders, tags, identities, group, secrets, the
    pending approval) are those in the context's `include` (LEGACY_DEFAULT by default: all but the pending
    approval); a relationship left out is empty (null for the group and the approval), as on Letta."""

    id = serializers.CharField()
    name = serializers.CharField()
    agent_type = serializers.CharField()
    description = serializers.CharField()
    system = serializers.SerializerMethodField()
    model = serializers.SerializerMethodField()
    embedding = serializers.SerializerMethodField()
    llm_config = serializers.SerializerMethodField()
    embedding_config = serializers.SerializerMethodField()
    model_settings = serializers.SerializerMethodField()
    compaction_settings = serializers.SerializerMethodField()
    context_window_limit = serializers.IntegerField(allow_null=True)
    memory = serializers.SerializerMethodField()
    blocks = serializers.SerializerMethodField()
    tools = serializers.SerializerMethodField()
    sources = serializers.SerializerMethodField()
    tags = serializers.SerializerMethodField()
    tool_rules = serializers.JSONField()
    message_ids = serializers.SerializerMethodField()
    metadata = serializers.JSONField()
    secrets = serializers.SerializerMethodField()
    tool_exec_environment_variables = serializers.SerializerMethodField()
    identity_ids = serializers.SerializerMethodField()
    identities = serializers.SerializerMethodField()
    managed_group = serializers.SerializerMethodField()
    multi_agent_group = serializers.SerializerMethodField()
    pending_approval = serializers.SerializerMethodField()
    response_format = serializers.SerializerMethodField()
    enable_sleeptime = serializers.BooleanField()
    message_buffer_autoclear = serializers.BooleanField()
    timezone = serializers.CharField()
    hidden = serializers.BooleanField()
    max_files_open = serializers.SerializerMethodField()
    per_file_view_window_char_limit = serializers.SerializerMethodField()
    last_run_completion = serializers.DateTimeField(allow_null=True)
    last_run_duration_ms = serializers.IntegerField(allow_null=True)
    last_stop_reason = serializers.SerializerMethodField()
    project_id = serializers.SerializerMethodField()
    template_id = serializers.SerializerMethodField()
    base_template_id = serializers.SerializerMethodField()
    created_by_id = serializers.CharField(allow_null=True)
    last_updated_by_id = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def to_representation(self, agent: Agent) -> dict[str, Any]:
        """What the declared fields render (tests/api/test_agent_include.py compares the two), built
        directly: DRF's per-field machinery (about 45 fields an agent) was half of a list page's CPU."""
        stamp = self._stamp
        last_run = agent.last_run_completion
        file_limits = self._file_limits(agent)
        return {
            "id": agent.id,
            "name": agent.name,
            "agent_type": agent.agent_type,
            "description": agent.description,
            "system": self.get_system(agent),
            "model": self.get_model(agent),
            "embedding": self.get_embedding(agent),
            "llm_config": self.get_llm_config(agent),
            "embedding_config": self.get_embedding_config(agent),
            "model_settings": self.get_model_settings(agent),
            "compaction_settings": self.get_compaction_settings(agent),
            "context_window_limit": agent.context_window_limit,
            "memory": self.get_memory(agent),
            "blocks": self.get_blocks(agent),
            "tools": self.get_tools(agent),
            "sources": self.get_sources(agent),
            "tags": self.get_tags(agent),
            "tool_rules": agent.tool_rules,
            "message_ids": self.get_message_ids(agent),
            "metadata": agent.metadata,
            "secrets": self.get_secrets(agent),
            "tool_exec_environment_variables": self.get_tool_exec_environment_variables(agent),
            "identity_ids": self.get_identity_ids(agent),
            "identities": self.get_identities(agent),
            "managed_group": self.get_managed_group(agent),
            "multi_agent_group": self.get_multi_agent_group(agent),
            "pending_approval": self.get_pending_approval(agent),
            "response_format": self.get_response_format(agent),
            "enable_sleeptime": agent.enable_sleeptime,
            "message_buffer_autoclear": agent.message_buffer_autoclear,
            "timezone": agent.timezone,
            "hidden": agent.hidden,
            "max_files_open": int(file_limits.max_files_open),
            "per_file_view_window_char_limit": int(file_limits.per_file_char_limit),
            "last_run_completion": stamp(last_run) if last_run is not None else None,
            "last_run_duration_ms": agent.last_run_duration_ms,
            "last_stop_reason": self.get_last_stop_reason(agent),
            "project_id": None,
            "template_id": None,
            "base_template_id": None,
            "created_by_id": agent.created_by_id,
            "last_updated_by_id": agent.last_updated_by_id,
            "created_at": stamp(agent.created_at),
            "updated_at": stamp(agent.updated_at),
        }

    def _chat(self, agent: Agent) -> agent_selectors.ChatModelInfo | None:
        return self.context["chat_models"].get(agent.model)

    @cached_property
    def _stamp(self) -> Callable[[Any], Any]:
        """How the declared DateTimeFields render, with the current timezone read once per response
        (DRF's field looks it up for every value)."""
        zone = django_timezone.get_current_timezone() if settings.USE_TZ else None
        drf = serializers.DateTimeField(default_timezone=zone).to_representation
        if zone is None or api_settings.DATETIME_FORMAT != ISO_8601:
            return drf

        def stamp(value: Any) -> Any:
            # DRF's rendering of an aware datetime in ISO 8601, without its per-value lookups.
            if not isinstance(value, datetime.datetime) or value.tzinfo is None:
                return drf(value)
            text = value.astimezone(zone).isoformat()
            return text[:-6] + "Z" if text.endswith("+00:00") else text

        return stamp

    @cached_property
    def _included(self) -> frozenset[str]:
        # Read once: `self.context` walks up to the list serializer on every access.
        return self.context.get("include", LEGACY_DEFAULT)

    def _has(self, relationship: str) -> bool:
        return relationship in self._included

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_tags(self, agent: Agent) -> list[str]:
        return list(agent.tags) if self._has("tags") else []

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_message_ids(self, agent: Agent) -> list[str]:
        """The context as Letta lists it: the stored system message first."""
        return with_thread_system_message(agent.id, None, agent.message_ids)

    def get_system(self, agent: Agent) -> str:
        return agent_selectors.agent_system_prompt(agent)

    def get_model(self, agent: Agent) -> str | None:
        return agent.model or None

    def get_embedding(self, agent: Agent) -> str | None:
        return agent.embedding or None

    @extend_schema_field(LlmConfigOut)
    def get_llm_config(self, agent: Agent) -> dict[str, Any]:
        return llm_config(agent, self._chat(agent))

    @extend_schema_field(EmbeddingConfigOut(allow_null=True))
    def get_embedding_config(self, agent: Agent) -> dict[str, Any] | None:
        return embedding_config(agent, self.context["embedding_models"].get(agent.embedding))

    @extend_schema_field(serializers.DictField())
    def get_model_settings(self, agent: Agent) -> dict[str, Any]:
        return model_settings(agent, self._chat(agent))

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_compaction_settings(self, agent: Agent) -> dict[str, Any] | None:
        return agent.compaction_settings or None

    # --- nested objects, through the response's Nested (see there) -----------------------------------------

    def _nested(self) -> Nested:
        nested = self.context.get("nested")  # agent_states gives one per response
        return nested if isinstance(nested, Nested) else Nested()

    def _blocks(self, agent: Agent) -> list[Any]:
        """The agent's blocks, rendered once for both `memory.blocks` and `blocks`."""
        if not self._has("blocks"):
            return []
        return self._nested().of(agent, "blocks", BlockOut, lambda: agent.blocks.all())

    @extend_schema_field(BlockOut(many=True))
    def get_blocks(self, agent: Agent) -> list[Any]:
        return self._blocks(agent)

    @extend_schema_field(ToolResponse(many=True))
    def get_tools(self, agent: Agent) -> list[Any]:
        if not self._has("tools"):
            return []
        # Most agents hold the same base tools: each is rendered once per response.
        return self._nested().each(ToolResponse, agent.tools.all(), key=lambda tool: tool.id)

    def _secrets(self, agent: Agent) -> list[Any]:
        if not self._has("secrets"):
            return []
        return self._nested().of(agent, "secrets", SecretOut, lambda: agent.secrets.all())

    @extend_schema_field(SecretOut(many=True))
    def get_secrets(self, agent: Agent) -> list[Any]:
        return self._secrets(agent)

    @extend_schema_field(SecretOut(many=True))
    def get_tool_exec_environment_variables(self, agent: Agent) -> list[Any]:
        return self._secrets(agent)

    @extend_schema_field(MemoryOut)
    def get_memory(self, agent: Agent) -> dict[str, Any]:
        return {
            "blocks": self._blocks(agent),
            "file_blocks": (
                self._nested().each(FileBlockOut, self._files(agent).file_blocks)
                if self._has("blocks")
                else []
            ),
            "prompt_template": "",
            "agent_type": agent.agent_type,
        }

    # --- folders (apps.folders): looked up once for every agent being rendered, then kept in the context.

    def _files(self, agent: Agent) -> Any:
        known: dict[str, Any] = self._looked_up("folders")
        if agent.id not in known:
            known.update(files_of_agents(self._batch(agent)))
        return known[agent.id]

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_sources(self, agent: Agent) -> list[Any]:
        if not self._has("sources"):
            return []
        return self._nested().each(FolderOut, self._files(agent).folders, key=lambda folder: folder.id)

    def _looked_up(self, name: str) -> dict[str, Any]:
        """What this response looked up under `name` (by agent or row id), kept in its context."""
        context = cast("dict[str, Any]", self.context)  # a dict: agent_states gives it
        return context.setdefault(name, {})

    def _batch(self, agent: Agent) -> list[Agent]:
        """The agents being rendered with this one (agent_states'), for lookups made once for all of them."""
        return [*self.context.get("batch", ()), agent]

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_identity_ids(self, agent: Agent) -> list[str]:
        """The agent's identities, oldest first: looked up once for every agent being rendered (the list's,
        or this one), then kept in the context."""
        if not self._has("identities"):
            return []
        known: dict[str, list[str]] = self._looked_up("identity_ids")
        if agent.id not in known:
            known.update(identity_ids_by_agent([a.id for a in self._batch(agent)]))
        return known[agent.id]

    @extend_schema_field(IdentityOut(many=True))
    def get_identities(self, agent: Agent) -> list[Any]:
        """Letta's Identity objects of `identity_ids`, each fetched and rendered once per response."""
        ids = self.get_identity_ids(agent)
        if not ids:
            return []
        rendered: dict[str, Any] = self._looked_up("identities")
        missing = [i for i in ids if i not in rendered]
        if missing:
            everyone = {i for a in self._batch(agent) for i in self.get_identity_ids(a)} - set(rendered)
            found = identity_queryset(actor=self.context["actor"]).filter(id__in=everyone)
            rendered.update({identity.id: IdentityOut(identity).data for identity in found})
        return [rendered[i] for i in ids if i in rendered]

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_managed_group(self, agent: Agent) -> dict[str, Any] | None:
        return sleeptime_group(agent) if self._has("managed_group") else None

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_multi_agent_group(self, agent: Agent) -> dict[str, Any] | None:
        return self.get_managed_group(agent)  # Letta's deprecated name for managed_group

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_pending_approval(self, agent: Agent) -> dict[str, Any] | None:
        """The approval request awaiting a decision (an approval_request_message), only when asked for
        (`include=agent.pending_approval`): looked up once for every agent being rendered."""
        if not self._has("pending_approval"):
            return None
        known: dict[str, Any] = self._looked_up("pending_approvals")
        if agent.id not in known:
            batch = self._batch(agent)
            found = agent_selectors.pending_approvals_by_agent(batch)
            known.update({a.id: found.get(a.id) for a in batch})
        pending = known[agent.id]
        return to_letta_messages(pending)[0] if pending is not None else None

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_response_format(self, agent: Agent) -> Any:
        return agent.model_settings.get("response_format")

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_max_files_open(self, agent: Agent) -> int:
        return int(self._file_limits(agent).max_files_open)

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_per_file_view_window_char_limit(self, agent: Agent) -> int:
        return int(self._file_limits(agent).per_file_char_limit)

    def _file_limits(self, agent: Agent) -> FileLimits:
        """With the folders or file blocks, from their lookup; else from the settings alone (lighter)."""
        if self._has("sources") or self._has("blocks"):
            return self._files(agent).limits
        known: dict[str, FileLimits] = self._looked_up("file_limits")
        if agent.id not in known:
            known.update(file_limits_by_agent(self._batch(agent)))
        return known[agent.id]

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_last_stop_reason(self, agent: Agent) -> str | None:
        return agent.last_stop_reason or None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_project_id(self, agent: Agent) -> None:
        return None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_template_id(self, agent: Agent) -> None:
        return None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_base_template_id(self, agent: Agent) -> None:
        return None


def agent_states(
    agents: Iterable[Agent], *, actor: Actor, include: frozenset[str] = LEGACY_DEFAULT
) -> list[dict[str, Any]]:
    """AgentState for agents prefetched with `include` (agent_selectors.agent_state_queryset), with their
    model handles resolved once per distinct handle."""
    agents = list(agents)
    if "tools" in include:
        agent_selectors.attach_shared_tools(agents)  # lists load them apart (agent_state_list)
    chat_models, embedding_models = agent_selectors.agent_model_infos(actor=actor, agents=agents)
    context = {
        "chat_models": chat_models,
        "embedding_models": embedding_models,
        "nested": Nested(),
        "include": include,
        "actor": actor,
        "batch": agents,
    }
    # One serializer for every agent, not DRF's ListSerializer: its child names it as parent, a cycle that
    # kept the page's agents and lookups alive until the garbage collector's next pass.
    serializer = AgentStateOut(context=context)
    return [serializer.to_representation(agent) for agent in agents]


def agent_state(agent: Agent, *, actor: Actor, include: frozenset[str] = LEGACY_DEFAULT) -> dict[str, Any]:
    return agent_states([agent], actor=actor, include=include)[0]


class TenantEndpointField(serializers.CharField):
    """A provider URL as a tenant may see it: never a deployment-configured host, no credentials
    (apps.llm.selectors.endpoint_for_tenants)."""

    def to_representation(self, value: Any) -> str | None:
        return endpoint_for_tenants(value)


class ModelOut(serializers.Serializer):
    """Letta's Model (an entry of GET /v1/models/)."""

    handle = serializers.CharField()
    model = serializers.CharField(source="name")
    name = serializers.CharField()
    display_name = serializers.CharField(source="name")
    model_endpoint_type = serializers.CharField(source="endpoint_type")
    model_endpoint = TenantEndpointField(source="endpoint", allow_null=True)
    provider_type = serializers.CharField()
    provider_name = serializers.CharField()
    provider_category = serializers.CharField(allow_null=True)
    context_window = serializers.IntegerField()
    max_context_window = serializers.IntegerField()
    model_type = serializers.SerializerMethodField()

    def get_model_type(self, info: Any) -> str:
        return "llm"


class EmbeddingModelOut(serializers.Serializer):
    """Letta's EmbeddingModel (an entry of GET /v1/models/embedding)."""

    handle = serializers.CharField()
    name = serializers.CharField()
    display_name = serializers.CharField(source="name")
    embedding_model = serializers.CharField(source="name")
    embedding_endpoint_type = serializers.CharField(source="endpoint_type")
    embedding_endpoint = TenantEndpointField(source="endpoint", allow_null=True)
    embedding_dim = serializers.IntegerField(source="dimension", allow_null=True)
    provider_type = serializers.CharField()
    provider_name = serializers.CharField()
    provider_category = serializers.CharField(allow_null=True)
    model_type = serializers.SerializerMethodField()

    def get_model_type(self, info: Any) -> str:
        return "embedding"


# --- Input -----------------------------------------------------------------------------------------------


class MemoryBlockIn(serializers.Serializer):
    """One entry of CreateAgent.memory_blocks; Letta's other CreateBlock fields are accepted and ignored."""

    label = serializers.CharField(max_length=200)
    value = serializers.CharField(allow_blank=True, trim_whitespace=False)
    limit = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    description = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    read_only = serializers.BooleanField(required=False, allow_null=True)
    metadata = serializers.DictField(required=False, allow_null=True)


class ModelSettingsIn(serializers.Serializer):
    """Letta's model_settings: the common knobs are checked; provider extras pass through unchanged."""

    provider_type = serializers.CharField(required=False, allow_null=True)
    temperature = serializers.FloatField(required=False, min_value=0, max_value=2)
    max_output_tokens = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    parallel_tool_calls = serializers.BooleanField(required=False)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        checked = super().to_internal_value(data)
        return {**data, **checked}


class SecretValueIn(serializers.CharField):
    """A secret's value: kept exactly as sent (blank allowed, no trimming)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_blank=True, trim_whitespace=False, **kwargs)


def _null_to_default(data: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """Absent and null both mean "the default" on create."""
    return {**data, **{key: value for key, value in defaults.items() if data.get(key) is None}}


def _config_handle(config: dict[str, Any], *, kind: str) -> str:
    """The handle an old client's llm_config / embedding_config names: its own, else
    '<endpoint type>/<model>' (Letta's configs carry both)."""
    if config.get("handle"):
        return str(config["handle"])
    endpoint, model = (
        (config.get("model_endpoint_type"), config.get("model"))
        if kind == "llm"
        else (config.get("embedding_endpoint_type"), config.get("embedding_model"))
    )
    return f"{endpoint}/{model}" if endpoint and model else ""


CREATE_UNSUPPORTED = {
    "from_template": CLOUD_ONLY,
    "template": CLOUD_ONLY,
    "project": CLOUD_ONLY,
    "memory_variables": CLOUD_ONLY,
    "reasoning": REASONING_IN_SETTINGS,
    "enable_reasoner": REASONING_IN_SETTINGS,
    "max_reasoning_tokens": REASONING_IN_SETTINGS,
}
"""CreateAgent fields Letta documents that this server refuses (422 naming them) rather than drop."""
UPDATE_UNSUPPORTED = {"reasoning": REASONING_IN_SETTINGS}
NO_LONGER_USED = ("embedding_chunk_size", "project_id", "template_id", "base_template_id")
"""Fields Letta documents as "Deprecated: No longer used": accepted, and (as on Letta) without effect."""


FILE_FIELDS = ("folder_ids", "source_ids", "max_files_open", "per_file_view_window_char_limit")
IDENTITY_FIELD = "identity_ids"
"""Honoured by apps.identities.services.agent_identities_set after the agent is created or updated."""
"""CreateAgent/UpdateAgent fields the folders app honours (apps.folders.services.agent_configure_files),
after the agent is created or updated: the agent services never see them."""


def files_kwargs(data: dict[str, Any], *, create: bool) -> dict[str, Any]:
    """Keyword arguments for apps.folders.services.agent_configure_files: folder_ids (source_ids, Letta's
    deprecated name, joins them), the limits, include_default_source. A list names the agent's folders."""
    ids = data.get("folder_ids"), data.get("source_ids")
    folder_ids = None if ids == (None, None) else list(dict.fromkeys([*(ids[0] or []), *(ids[1] or [])]))
    return {
        "folder_ids": folder_ids if folder_ids or not create else None,
        "max_files_open": data.get("max_files_open"),
        "per_file_view_window_char_limit": data.get("per_file_view_window_char_limit"),
        "include_default_source": bool(data.get("include_default_source")),
    }


class AgentCreateIn(serializers.Serializer):
    """Letta's CreateAgent. Deprecated aliases are folded into their replacements; what this server does
    not serve is refused by name (CREATE_UNSUPPORTED); Letta's no-longer-used fields are accepted. The file
    fields (FILE_FIELDS, include_default_source) are for the folders app: `files_kwargs()`."""

    folder_ids = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)
    source_ids = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)
    identity_ids = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)
    include_default_source = serializers.BooleanField(required=False, allow_null=True)
    max_files_open = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=1000)
    per_file_view_window_char_limit = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=2**31 - 1
    )

    name = serializers.CharField(required=False, allow_null=True)
    description = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    agent_type = serializers.ChoiceField(choices=AGENT_TYPES, required=False, allow_null=True)
    system = serializers.CharField(required=False, allow_blank=True, allow_null=True, trim_whitespace=False)
    model = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    embedding = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    context_window_limit = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    model_settings = ModelSettingsIn(required=False, allow_null=True)
    compaction_settings = serializers.DictField(required=False, allow_null=True)
    memory_blocks = MemoryBlockIn(many=True, required=False, allow_null=True)
    block_ids = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)
    tools = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)
    tool_ids = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)
    include_base_tools = serializers.BooleanField(required=False, default=True)
    include_multi_agent_tools = serializers.BooleanField(required=False, allow_null=True)
    include_base_tool_rules = serializers.BooleanField(required=False, allow_null=True)
    tool_rules = serializers.ListField(child=serializers.JSONField(), required=False, allow_null=True)
    tags = serializers.ListField(child=serializers.CharField(max_length=100), required=False, allow_null=True)
    metadata = serializers.DictField(required=False, allow_null=True)
    secrets = serializers.DictField(child=SecretValueIn(), required=False, allow_null=True)
    enable_sleeptime = serializers.BooleanField(required=False, allow_null=True)
    message_buffer_autoclear = serializers.BooleanField(required=False, allow_null=True)
    hidden = serializers.BooleanField(required=False, allow_null=True)
    timezone = serializers.CharField(required=False, allow_null=True)
    # Deprecated aliases, folded in by validate().
    tool_exec_environment_variables = serializers.DictField(
        child=SecretValueIn(), required=False, allow_null=True
    )
    llm_config = serializers.DictField(required=False, allow_null=True)
    embedding_config = serializers.DictField(required=False, allow_null=True)
    max_tokens = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    parallel_tool_calls = serializers.BooleanField(required=False, allow_null=True)
    response_format = serializers.DictField(required=False, allow_null=True)
    initial_message_sequence = serializers.ListField(
        child=serializers.DictField(), required=False, allow_null=True, max_length=1000
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        refuse_unsupported(self.initial_data, CREATE_UNSUPPORTED)
        attrs = dict(attrs)
        llm = attrs.pop("llm_config", None) or {}
        emb = attrs.pop("embedding_config", None) or {}
        if not attrs.get("model"):
            attrs["model"] = _config_handle(llm, kind="llm") or attrs.get("model")
        if attrs.get("context_window_limit") is None and llm.get("context_window"):
            attrs["context_window_limit"] = llm["context_window"]
        if not attrs.get("embedding"):
            attrs["embedding"] = _config_handle(emb, kind="embedding") or attrs.get("embedding")
        sequence = attrs.pop("initial_message_sequence", None)
        if sequence is not None:
            attrs["initial_messages"] = [
                _message_create(item, f"initial_message_sequence[{index}]")
                for index, item in enumerate(sequence)
            ]
        settings = dict(attrs.pop("model_settings", None) or {})
        response_format = attrs.pop("response_format", None)
        if response_format is not None:
            settings.setdefault("response_format", response_format)
        for legacy, key in (
            ("max_tokens", "max_output_tokens"),
            ("parallel_tool_calls", "parallel_tool_calls"),
        ):
            value = attrs.pop(legacy, None)
            if value is not None:
                settings.setdefault(key, value)
        if llm.get("temperature") is not None:
            settings.setdefault("temperature", llm["temperature"])
        attrs["model_settings"] = settings
        legacy_secrets = attrs.pop("tool_exec_environment_variables", None)
        if attrs.get("secrets") is None and legacy_secrets is not None:
            attrs["secrets"] = legacy_secrets
        return attrs

    def to_service_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for agents.services.agent_create_with_settings (nulls become defaults)."""
        data = _null_to_default(
            self.validated_data,
            {
                "description": "",
                "agent_type": AgentType.LETTA_V1.value,
                "system": "",
                "model": "",
                "embedding": "",
                "enable_sleeptime": False,
                "message_buffer_autoclear": False,
                "hidden": False,
                "timezone": "UTC",
                "include_base_tool_rules": False,
            },
        )
        blocks = [
            BlockSpec(
                label=b["label"],
                value=b["value"],
                limit=b.get("limit"),
                description=b.get("description") or "",
                read_only=bool(b.get("read_only")),
                metadata=b.get("metadata") or {},
            )
            for b in data.get("memory_blocks") or []
        ]
        return {
            "name": data.get("name"),
            "description": data["description"],
            "agent_type": data["agent_type"],
            "system": data["system"],
            "model": data["model"],
            "embedding": data["embedding"],
            "context_window_limit": data.get("context_window_limit"),
            "model_settings": data.get("model_settings"),
            "compaction_settings": data.get("compaction_settings"),
            "memory_blocks": blocks,
            "block_ids": data.get("block_ids") or [],
            "tools": [
                *(data.get("tools") or []),
                *(MULTI_AGENT_TOOLS if data.get("include_multi_agent_tools") else ()),
            ],
            "tool_ids": data.get("tool_ids") or [],
            "include_base_tools": data["include_base_tools"],
            "include_base_tool_rules": data["include_base_tool_rules"],
            "tool_rules": data.get("tool_rules") or [],
            "tags": data.get("tags") or [],
            "metadata": data.get("metadata") or {},
            "secrets_": data.get("secrets") or {},
            "enable_sleeptime": data["enable_sleeptime"],
            "message_buffer_autoclear": data["message_buffer_autoclear"],
            "hidden": data["hidden"],
            "timezone_name": data["timezone"],
            "initial_messages": data.get("initial_messages"),
        }

    def files_kwargs(self) -> dict[str, Any]:
        return files_kwargs(self.validated_data, create=True)


class AgentUpdateIn(serializers.Serializer):
    """Letta's UpdateAgent. Absent = keep; null = clear (where clearing means something); lists replace. The
    file fields (FILE_FIELDS) are for the folders app: `files_kwargs()`."""

    folder_ids = serializers.ListField(child=serializers.CharField(), allow_null=True)
    source_ids = serializers.ListField(child=serializers.CharField(), allow_null=True)
    identity_ids = serializers.ListField(child=serializers.CharField(), allow_null=True)
    max_files_open = serializers.IntegerField(allow_null=True, min_value=1, max_value=1000)
    per_file_view_window_char_limit = serializers.IntegerField(
        allow_null=True, min_value=1, max_value=2**31 - 1
    )
    name = serializers.CharField()
    description = serializers.CharField(allow_blank=True, allow_null=True)
    system = serializers.CharField(allow_blank=True, allow_null=True, trim_whitespace=False)
    tags = serializers.ListField(child=serializers.CharField(max_length=100), allow_null=True)
    metadata = serializers.DictField(allow_null=True)
    model = serializers.CharField()
    embedding = serializers.CharField(allow_blank=True, allow_null=True)
    context_window_limit = serializers.IntegerField(allow_null=True, min_value=1)
    model_settings = ModelSettingsIn(allow_null=True)
    compaction_settings = serializers.DictField(allow_null=True)
    timezone = serializers.CharField(allow_null=True)
    secrets = serializers.DictField(child=SecretValueIn(), allow_null=True)
    message_buffer_autoclear = serializers.BooleanField()
    enable_sleeptime = serializers.BooleanField()
    hidden = serializers.BooleanField()
    tool_ids = serializers.ListField(child=serializers.CharField())
    block_ids = serializers.ListField(child=serializers.CharField())
    tool_rules = serializers.ListField(child=serializers.JSONField(), allow_null=True)
    message_ids = serializers.ListField(child=serializers.CharField())
    last_run_completion = serializers.DateTimeField(allow_null=True)
    last_run_duration_ms = serializers.IntegerField(allow_null=True, min_value=0)
    last_stop_reason = serializers.ChoiceField(choices=[r.value for r in StopReason], allow_null=True)
    # Deprecated aliases, folded in by validate().
    tool_exec_environment_variables = serializers.DictField(child=SecretValueIn(), allow_null=True)
    llm_config = serializers.DictField(allow_null=True)
    embedding_config = serializers.DictField(allow_null=True)
    max_tokens = serializers.IntegerField(allow_null=True, min_value=1)
    parallel_tool_calls = serializers.BooleanField(allow_null=True)
    response_format = serializers.DictField(allow_null=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Every field is optional: PATCH semantics, with absent kept apart from null."""
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.required = False

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        refuse_unsupported(self.initial_data, UPDATE_UNSUPPORTED)
        attrs = dict(attrs)
        llm = attrs.pop("llm_config", None) or {}
        emb = attrs.pop("embedding_config", None) or {}
        if "model" not in attrs and _config_handle(llm, kind="llm"):
            attrs["model"] = _config_handle(llm, kind="llm")
        if "context_window_limit" not in attrs and llm.get("context_window"):
            attrs["context_window_limit"] = llm["context_window"]
        if "embedding" not in attrs and _config_handle(emb, kind="embedding"):
            attrs["embedding"] = _config_handle(emb, kind="embedding")
        legacy = {
            key: attrs.pop(old)
            for old, key in (
                ("max_tokens", "max_output_tokens"),
                ("parallel_tool_calls", "parallel_tool_calls"),
            )
            if attrs.get(old) is not None
        }
        if llm.get("temperature") is not None:
            legacy["temperature"] = llm["temperature"]
        if attrs.get("response_format") is not None:
            legacy["response_format"] = attrs["response_format"]
        attrs.pop("response_format", None)
        attrs.pop("max_tokens", None)
        attrs.pop("parallel_tool_calls", None)
        if legacy and "model_settings" not in attrs:
            attrs["model_settings"] = legacy
        legacy_secrets = attrs.pop("tool_exec_environment_variables", None)
        if "secrets" not in attrs and legacy_secrets is not None:
            attrs["secrets"] = legacy_secrets
        return attrs

    def to_service_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for agents.services.agent_update: only what the request named."""
        renamed = {"secrets": "secrets_", "timezone": "timezone_name"}
        return {
            renamed.get(key, key): value
            for key, value in self.validated_data.items()
            if key not in FILE_FIELDS and key != IDENTITY_FIELD
        }

    def files_kwargs(self) -> dict[str, Any]:
        return files_kwargs(self.validated_data, create=False)
