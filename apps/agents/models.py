from __future__ import annotations

import json
import zlib
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex, OpClass
from django.contrib.postgres.search import SearchVector
from django.db import models
from django.db.models import Func, Q, Value
from pgvector.django import HnswIndex, VectorField

from apps.core.crypto import EncryptedTextField
from apps.core.ids import (
    ID_MAX_LENGTH,
    new_agent_env_id,
    new_agent_id,
    new_conversation_id,
    new_group_id,
    new_group_turn_id,
    new_message_id,
    new_run_id,
    new_step_id,
)
from apps.core.models import IdArrayField, OrgOwnedModel
from apps.memory.models import INDEXED_HALFVEC_DIMENSIONS, INDEXED_VECTOR_DIMENSIONS, vector_index_expression

MESSAGE_SEQUENCE = "agents_message_sequence"


class AgentType(models.TextChoices):
    LETTA_V1 = "letta_v1_agent"
    MEMGPT = "memgpt_agent"
    MEMGPT_V2 = "memgpt_v2_agent"
    REACT = "react_agent"
    WORKFLOW = "workflow_agent"
    SPLIT_THREAD = "split_thread_agent"
    SLEEPTIME = "sleeptime_agent"
    VOICE_CONVO = "voice_convo_agent"
    VOICE_SLEEPTIME = "voice_sleeptime_agent"


class StopReason(models.TextChoices):
    END_TURN = "end_turn"
    MAX_STEPS = "max_steps"
    TOOL_RULE = "tool_rule"
    REQUIRES_APPROVAL = "requires_approval"
    CANCELLED = "cancelled"
    ERROR = "error"
    INVALID_TOOL_CALL = "invalid_tool_call"
    NO_TOOL_CALL = "no_tool_call"
    INVALID_LLM_RESPONSE = "invalid_llm_response"
    LLM_API_ERROR = "llm_api_error"
    MAX_TOKENS_EXCEEDED = "max_tokens_exceeded"
    CONTEXT_WINDOW_OVERFLOW_IN_SYSTEM_PROMPT = "context_window_overflow_in_system_prompt"


def save_without_message_count(instance: models.Model, save: Any, *args: Any, **kwargs: Any) -> None:
    """`message_count` belongs to the triggers of migration 0005: saving an existing row writes every
    other field (a full save, e.g. the admin's change form, would write back the count it loaded and
    lose the messages stored since)."""
    if not instance._state.adding and kwargs.get("update_fields") is None and not kwargs.get("force_insert"):
        kwargs["update_fields"] = [
            f.name for f in instance._meta.concrete_fields if not f.primary_key and f.name != "message_count"
        ]
    save(*args, **kwargs)


class Agent(OrgOwnedModel):
    """A stateful agent: a row, not a process. Everything the loop needs is here or one join away."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_agent_id, editable=False)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    agent_type = models.CharField(max_length=32, choices=AgentType.choices, default=AgentType.LETTA_V1)
    system = models.TextField(blank=True, default="", help_text="The system prompt.")

    # LLM settings; `model` is a Letta handle such as openai/gpt-4o-mini.
    model = models.CharField(max_length=300, blank=True, default="")
    context_window_limit = models.PositiveIntegerField(null=True, blank=True)
    temperature = models.FloatField(default=0.7)
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    parallel_tool_calls = models.BooleanField(default=False)
    model_settings = models.JSONField(default=dict, blank=True, help_text="Provider-specific extras.")

    embedding = models.CharField(max_length=300, blank=True, default="", help_text="Embedding model handle.")
    embedding_dim = models.PositiveIntegerField(null=True, blank=True)

    tags = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    tool_rules = models.JSONField(default=list, blank=True)
    message_ids = IdArrayField(
        models.CharField(max_length=ID_MAX_LENGTH),
        default=list,
        blank=True,
        help_text="In-context messages of the default conversation, in order (the first is the system message).",
    )
    message_count = models.BigIntegerField(
        default=0,
        editable=False,
        help_text="Stored messages of the default conversation, kept by a database trigger (migration 0005).",
    )

    enable_sleeptime = models.BooleanField(default=False)
    sleeptime_agent_frequency = models.PositiveIntegerField(default=5)
    sleeptime_agent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="primary_agents"
    )
    sleeptime_turns_counter = models.PositiveIntegerField(default=0)
    sleeptime_last_processed_message = models.CharField(max_length=ID_MAX_LENGTH, blank=True, default="")

    timezone = models.CharField(max_length=64, default="UTC")
    message_buffer_autoclear = models.BooleanField(default=False)
    compaction_settings = models.JSONField(default=dict, blank=True)
    hidden = models.BooleanField(default=False)

    last_run_completion = models.DateTimeField(null=True, blank=True)
    last_run_duration_ms = models.PositiveIntegerField(null=True, blank=True)
    last_stop_reason = models.CharField(max_length=64, choices=StopReason.choices, blank=True, default="")

    blocks = models.ManyToManyField(
        "memory.Block", through="memory.AgentBlock", related_name="agents", blank=True
    )
    tools = models.ManyToManyField("tools.Tool", through="AgentTool", related_name="agents", blank=True)
    archives = models.ManyToManyField("memory.Archive", related_name="agents", blank=True)

    created_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    last_updated_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at"]
        indexes = [
            GinIndex(fields=["tags"], name="agent_tags_gin"),
            models.Index(fields=["organization", "name"], name="agent_org_name_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        save_without_message_count(self, super().save, *args, **kwargs)


class AgentTool(models.Model):
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="tool_attachments")
    tool = models.ForeignKey("tools.Tool", on_delete=models.CASCADE, related_name="agent_attachments")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "tool"], name="agent_tool_unique")]

    def __str__(self) -> str:
        return f"{self.tool_id} on {self.agent_id}"


class AgentSecret(OrgOwnedModel):
    """An agent's tool environment variable (Letta's `secrets`). Encrypted; never returned or exported."""

    id = models.CharField(
        primary_key=True, max_length=ID_MAX_LENGTH, default=new_agent_env_id, editable=False
    )
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="secrets")
    key = models.CharField(max_length=200)
    value = EncryptedTextField(help_text="Write-only; never shown again after saving.")
    description = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["key"]
        constraints = [models.UniqueConstraint(fields=["agent", "key"], name="agent_secret_unique_key")]

    def __str__(self) -> str:
        return self.key


class Conversation(OrgOwnedModel):
    """A thread of an agent. Messages are isolated per conversation; memory blocks are shared."""

    id = models.CharField(
        primary_key=True, max_length=ID_MAX_LENGTH, default=new_conversation_id, editable=False
    )
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="conversations")
    summary = models.CharField(max_length=500, blank=True, default="")
    message_ids = ArrayField(models.CharField(max_length=ID_MAX_LENGTH), default=list, blank=True)
    message_count = models.BigIntegerField(
        default=0, editable=False, help_text="Stored messages, kept by a database trigger (migration 0005)."
    )
    created_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return self.summary or self.id

    def save(self, *args: Any, **kwargs: Any) -> None:
        save_without_message_count(self, super().save, *args, **kwargs)


class Run(OrgOwnedModel):
    class Status(models.TextChoices):
        CREATED = "created"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_run_id, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="runs")
    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.CASCADE, related_name="runs"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CREATED)
    stop_reason = models.CharField(max_length=64, choices=StopReason.choices, blank=True, default="")
    background = models.BooleanField(default=False)
    callback_url = models.URLField(blank=True, default="")
    request_config = models.JSONField(default=dict, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    error = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    total_duration_ns = models.BigIntegerField(null=True, blank=True)
    ttft_ns = models.BigIntegerField(null=True, blank=True)
    # Set afresh each time an executor claims the run; the loop's writes carry it and the database refuses
    # them once the run was handed to another executor or failed by recovery (apps.agents.loop.store).
    lease = models.CharField(max_length=32, blank=True, default="", editable=False)
    created_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["agent", "status"], name="run_agent_status_idx")]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"


FEEDBACK_NOTE_MAX_CHARS = 2000


class Step(OrgOwnedModel):
    """One LLM call of a run and its outcome."""

    class Status(models.TextChoices):
        PENDING = "pending"
        SUCCESS = "success"
        FAILED = "failed"
        CANCELLED = "cancelled"

    class Feedback(models.TextChoices):
        POSITIVE = "positive"
        NEGATIVE = "negative"

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_step_id, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="steps")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="steps")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    stop_reason = models.CharField(max_length=64, choices=StopReason.choices, blank=True, default="")
    model = models.CharField(max_length=300, blank=True, default="")
    model_handle = models.CharField(max_length=300, blank=True, default="")
    model_endpoint = models.CharField(max_length=500, blank=True, default="")
    provider_name = models.CharField(max_length=100, blank=True, default="")
    context_window_limit = models.PositiveIntegerField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    total_tokens = models.PositiveIntegerField(default=0)
    cached_input_tokens = models.PositiveIntegerField(null=True, blank=True)
    reasoning_tokens = models.PositiveIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    feedback = models.CharField(max_length=16, choices=Feedback.choices, blank=True, default="")
    # A person's words with the thumbs up/down (an extension: Letta's feedback has none), for datasets.
    feedback_note = models.TextField(blank=True, default="", max_length=FEEDBACK_NOTE_MAX_CHARS)
    tags = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    error_type = models.CharField(max_length=200, blank=True, default="")
    error_data = models.JSONField(null=True, blank=True)
    logprobs = models.JSONField(
        null=True,
        blank=True,
        help_text="The LLM call's output-token log probabilities, when the send asked for them (return_logprobs).",
    )
    trace = models.BinaryField(
        null=True,
        blank=True,
        editable=False,
        help_text="The exact request sent to the LLM and its response (pack_trace): zlib-compressed JSON.",
    )

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return self.id

    @property
    def request_json(self) -> Any:
        return unpack_trace(self.trace).get("request")

    @property
    def response_json(self) -> Any:
        return unpack_trace(self.trace).get("response")


TRACE_COMPRESSION_LEVEL = 1
"""zlib's fastest level: a step's trace holds its whole context (hundreds of messages, ~100 KB of JSON),
so it is the largest write of a step; compressed it is several times smaller, and PostgreSQL stores the
bytes as they are instead of parsing JSON and compressing it again."""


def pack_trace(request: Any, response: Any) -> bytes:
    """A request that carries its JSON already (apps.llm.client.EncodedTrace) is not encoded again."""
    request_text = getattr(request, "json_text", None) or json.dumps(
        request, separators=(",", ":"), default=str
    )
    response_text = json.dumps(response, separators=(",", ":"), default=str)
    document = '{"request":' + request_text + ',"response":' + response_text + "}"
    return zlib.compress(document.encode(), TRACE_COMPRESSION_LEVEL)


def unpack_trace(trace: bytes | memoryview | None) -> dict[str, Any]:
    return json.loads(zlib.decompress(trace)) if trace else {}


class Message(OrgOwnedModel):
    """Every message ever exchanged (recall memory). Only the ids listed in the agent's or conversation's
    `message_ids` are in the context window; the rest stay searchable."""

    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"
        TOOL = "tool"
        APPROVAL = "approval"
        SUMMARY = "summary"

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_message_id, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="messages")
    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.CASCADE, related_name="messages"
    )
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="messages")
    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.SET_NULL, related_name="messages")
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.JSONField(
        default=list, blank=True, help_text="Content parts: [{type: text, text}, ...]."
    )
    text = models.TextField(blank=True, default="", help_text="Plain text of the content, for recall search.")
    name = models.CharField(max_length=200, blank=True, default="")
    tool_calls = models.JSONField(null=True, blank=True, help_text="OpenAI format: [{id, type, function}].")
    tool_call_id = models.CharField(max_length=200, blank=True, default="")
    tool_returns = models.JSONField(null=True, blank=True)
    approvals = models.JSONField(null=True, blank=True)
    approve = models.BooleanField(null=True, blank=True)
    approval_request_id = models.CharField(max_length=200, blank=True, default="")
    denial_reason = models.TextField(blank=True, default="")
    otid = models.CharField(
        max_length=200, blank=True, default="", help_text="Client-supplied id (idempotency)."
    )
    sender_id = models.CharField(max_length=ID_MAX_LENGTH, blank=True, default="")
    model = models.CharField(max_length=300, blank=True, default="")
    is_err = models.BooleanField(default=False)
    sequence_id = models.BigIntegerField(
        db_default=Func(Value(MESSAGE_SEQUENCE), function="nextval"),
        unique=True,
        editable=False,
        help_text="Monotonic across all messages: orders history and serves as a pagination cursor.",
    )
    # Recall's semantic half, filled after the fact by apps.agents.recall.embed_messages (NULL until then,
    # or for good when the agent has no embedding model): same layout as Passage.embedding.
    embedding = VectorField(null=True, blank=True)
    embedding_dim = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["sequence_id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(embedding__isnull=True, embedding_dim__isnull=True)
                | Q(embedding__isnull=False, embedding_dim__isnull=False),
                name="message_embedding_has_dim",
            ),
            # A client id (otid) takes one run per agent conversation, even when two resends race past
            # run_find_by_otids together: the second insert fails and the API answers from the first.
            models.UniqueConstraint(
                fields=["agent", "conversation", "otid"],
                condition=~Q(otid="") & Q(run__isnull=False),
                nulls_distinct=False,  # the default conversation is NULL
                name="message_otid_once_per_conversation",
            ),
        ]
        indexes = [
            models.Index(fields=["agent", "conversation", "sequence_id"], name="message_agent_conv_seq_idx"),
            models.Index(fields=["run"], name="message_run_idx"),
            GinIndex(SearchVector("text", config="english"), name="message_text_fts"),
            *[
                HnswIndex(
                    OpClass(vector_index_expression(dim), name="vector_cosine_ops"),
                    name=f"message_emb_{dim}_hnsw",
                    condition=Q(embedding_dim=dim),
                    m=16,
                    ef_construction=64,
                )
                for dim in INDEXED_VECTOR_DIMENSIONS
            ],
            *[
                HnswIndex(
                    OpClass(vector_index_expression(dim), name="halfvec_cosine_ops"),
                    name=f"message_emb_{dim}_hnsw",
                    condition=Q(embedding_dim=dim),
                    m=16,
                    ef_construction=64,
                )
                for dim in INDEXED_HALFVEC_DIMENSIONS
            ],
        ]

    def __str__(self) -> str:
        return f"{self.role}: {self.text[:60]}"

    @property
    def is_approval_request(self) -> bool:
        """An approval message asking for a decision on its tool calls (not a decision: that one has
        `approvals`). The last in-context one of a thread awaits its decision."""
        return self.role == Message.Role.APPROVAL and bool(self.tool_calls)


class ManagerType(models.TextChoices):
    """Letta's group patterns (schemas/group.py). voice_sleeptime and swarm are stored names only: a group
    of either cannot be created here."""

    ROUND_ROBIN = "round_robin"
    SUPERVISOR = "supervisor"
    DYNAMIC = "dynamic"
    SLEEPTIME = "sleeptime"
    VOICE_SLEEPTIME = "voice_sleeptime"
    SWARM = "swarm"


class Group(OrgOwnedModel):
    """A multi-agent group (Letta's Group): its participants in speaking order (GroupMember) and its manager.

    A sleeptime group (manager_type sleeptime) is the record of a primary agent's sleeptime pairing: its
    manager is the primary, its one participant the sleeptime agent (apps.agents.groups)."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_group_id, editable=False)
    manager_type = models.CharField(
        max_length=32, choices=ManagerType.choices, default=ManagerType.ROUND_ROBIN
    )
    description = models.TextField(blank=True, default="")
    manager_agent = models.ForeignKey(
        Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="managed_groups"
    )
    termination_token = models.CharField(max_length=200, blank=True, default="")
    max_turns = models.PositiveIntegerField(null=True, blank=True)
    sleeptime_agent_frequency = models.PositiveIntegerField(null=True, blank=True)
    turns_counter = models.IntegerField(null=True, blank=True)
    last_processed_message_id = models.CharField(max_length=ID_MAX_LENGTH, blank=True, default="")
    max_message_buffer_length = models.PositiveIntegerField(null=True, blank=True)
    min_message_buffer_length = models.PositiveIntegerField(null=True, blank=True)
    shared_block_ids = ArrayField(models.CharField(max_length=ID_MAX_LENGTH), default=list, blank=True)
    project_id = models.CharField(max_length=200, blank=True, default="")
    hidden = models.BooleanField(null=True, blank=True)
    created_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["organization", "manager_type"], name="group_org_type_idx")]

    def __str__(self) -> str:
        return f"{self.manager_type} group ({self.id})"


class GroupMember(models.Model):
    """A participant of a group, at its place in the speaking order. `unseen`: what others said in the
    group after this agent last spoke ([{"agent_id", "name", "text"}]), given to it when it speaks next."""

    group = models.ForeignKey(Group, on_delete=models.CASCADE, related_name="members")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="group_memberships")
    position = models.PositiveIntegerField()
    unseen = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(fields=["group", "agent"], name="group_member_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id} in {self.group_id}"


class GroupTurn(OrgOwnedModel):
    """One message sent to a group and everything its agents said in answer: the parent of the runs of
    the agents who spoke (GroupTurnRun), cancellable as a whole. Driven by apps.agents.group_turns."""

    id = models.CharField(
        primary_key=True, max_length=ID_MAX_LENGTH, default=new_group_turn_id, editable=False
    )
    group = models.ForeignKey(Group, on_delete=models.CASCADE, related_name="turns")
    status = models.CharField(max_length=16, choices=Run.Status.choices, default=Run.Status.CREATED)
    stop_reason = models.CharField(max_length=64, choices=StopReason.choices, blank=True, default="")
    error = models.JSONField(null=True, blank=True)
    input = models.JSONField(default=list, blank=True, help_text="The sent messages: [{role, content, ...}].")
    transcript = models.JSONField(
        default=list, blank=True, help_text="What was said in this turn: [{agent_id, name, text}]."
    )
    state = models.JSONField(default=dict, blank=True, help_text="The orchestration's progress.")
    max_steps = models.PositiveIntegerField(null=True, blank=True)
    background = models.BooleanField(default=False)
    current_run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["group", "status"], name="group_turn_status_idx")]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"


class GroupTurnRun(models.Model):
    """A run of one agent in a group turn, in speaking order. `kind`: speaker (says something in the group),
    manager (a dynamic group's choice of the next speaker) or supervisor. `carries_input`: its input holds
    the message the group was sent (shown once in the group's timeline)."""

    turn = models.ForeignKey(GroupTurn, on_delete=models.CASCADE, related_name="run_links")
    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="group_link")
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, default="speaker")
    carries_input = models.BooleanField(default=False)

    class Meta:
        ordering = ["position"]
        constraints = [models.UniqueConstraint(fields=["turn", "position"], name="group_turn_run_position")]

    def __str__(self) -> str:
        return f"{self.run_id} in {self.turn_id}"
