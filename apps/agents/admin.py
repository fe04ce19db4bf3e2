from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from apps.accounts.admin_base import (
    OrgAdminForm,
    OrgScopedAdmin,
    OrgScopedInline,
    admin_actor,
    admin_require,
    admin_roles,
    secret_form,
)
from apps.agents import services
from apps.agents.models import (
    Agent,
    AgentSecret,
    AgentTool,
    Conversation,
    Group,
    GroupMember,
    GroupTurn,
    GroupTurnRun,
    Message,
    Run,
    Step,
)
from apps.core.errors import PermissionDenied
from apps.core.permissions import Action
from apps.memory import services as memory_services
from apps.memory.models import AgentBlock
from apps.tools.rules import ToolRuleError, dump_tool_rules, parse_tool_rules


class AgentAdminForm(OrgAdminForm):
    class Meta:
        model = Agent
        fields = "__all__"

    def clean_tool_rules(self) -> Any:
        try:
            return dump_tool_rules(parse_tool_rules(self.cleaned_data["tool_rules"]))
        except ToolRuleError as exc:
            raise ValidationError(exc.message) from exc


class AgentBlockInline(OrgScopedInline):
    model = AgentBlock
    fields = ["block", "block_label"]
    readonly_fields = ["block_label"]
    raw_id_fields = ["block"]

    def clean_inline_form(self, request: HttpRequest, form: forms.ModelForm) -> None:
        """Attaching a block the agent may rewrite is writing it (as memory.services.block_attach_to_agent)."""
        block = form.cleaned_data.get("block")
        if block is None or block.read_only:
            return
        try:
            admin_require(
                request,
                block.organization_id,
                Action.BLOCK_WRITE,
                creator_id=block.created_by_id,
                subject=f"block '{block.label}'",
            )
        except PermissionDenied as exc:
            form.add_error("block", exc.message)


class AgentToolInline(OrgScopedInline):
    model = AgentTool
    raw_id_fields = ["tool"]


class AgentSecretInline(OrgScopedInline):
    model = AgentSecret
    form = secret_form(AgentSecret, ("value",))
    fields = ["key", "value", "description"]


@admin.register(Agent)
class AgentAdmin(OrgScopedAdmin):
    """A member changes and deletes the agents they created; owners and admins every agent."""

    form = AgentAdminForm
    add_action = Action.AGENT_CREATE
    change_action = Action.AGENT_CONFIGURE
    delete_action = Action.AGENT_DELETE
    list_display = ["name", "id", "agent_type", "model", "enable_sleeptime", "organization", "updated_at"]
    list_filter = ["agent_type", "enable_sleeptime", "model"]
    search_fields = ["name", "id", "description", "tags"]
    raw_id_fields = ["sleeptime_agent", "created_by", "last_updated_by"]
    filter_horizontal = ["archives"]
    inlines = [AgentBlockInline, AgentToolInline, AgentSecretInline]

    def save_model(self, request: HttpRequest, obj: Agent, form: Any, change: bool) -> None:
        if not change and obj.created_by_id is None and obj.organization_id in admin_roles(request):
            obj.created_by = request.user  # as the services record who created it
        super().save_model(request, obj, form, change)
        if not change or "tags" in form.changed_data:  # as agent_create and agent_update do
            memory_services.git_memory_tags_saved(agent=obj)

    def delete_model(self, request: HttpRequest, obj: Agent) -> None:
        # Through the service, as the API and the ADE delete: it also forgets the agent's LLM call records.
        with self.refusal_shown(request):
            services.agent_delete(actor=admin_actor(request, obj.organization_id), agent_id=obj.pk)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for agent in queryset:
            self.delete_model(request, agent)

    def save_formset(self, request: Any, form: Any, formset: Any, change: bool) -> None:
        instances = formset.save(commit=False)
        for instance in instances:
            if isinstance(instance, AgentBlock):
                instance.block_label = instance.block.label
            if isinstance(instance, AgentSecret):
                instance.organization_id = form.instance.organization_id
            instance.save()
        for obj in formset.deleted_objects:
            obj.delete()


@admin.register(AgentSecret)
class AgentSecretAdmin(OrgScopedAdmin):
    form = secret_form(AgentSecret, ("value",))
    add_action = change_action = Action.AGENT_CONFIGURE
    via = "agent"
    list_display = ["key", "agent", "organization", "updated_at"]
    search_fields = ["key", "agent__name"]
    raw_id_fields = ["agent"]


@admin.register(Conversation)
class ConversationAdmin(OrgScopedAdmin):
    """Rows of an agent: changed by whoever may configure that agent."""

    add_action = change_action = Action.AGENT_CONFIGURE
    via = "agent"
    list_display = ["id", "agent", "summary", "organization", "created_at"]
    search_fields = ["id", "summary", "agent__name"]
    raw_id_fields = ["agent"]
    list_select_related = ["agent"]


@admin.register(Message)
class MessageAdmin(OrgScopedAdmin):
    """Rows of an agent: changed by whoever may configure that agent."""

    add_action = change_action = Action.AGENT_CONFIGURE
    via = "agent"
    list_display = ["id", "role", "short_text", "agent", "sequence_id", "created_at"]
    list_filter = ["role", "is_err"]
    search_fields = ["id", "text", "agent__name", "otid"]
    raw_id_fields = ["agent", "conversation", "run", "step"]
    readonly_fields = ["sequence_id"]
    list_select_related = ["agent"]

    @admin.display(description="Text")
    def short_text(self, obj: Message) -> str:
        return obj.text[:80]


@admin.register(Run)
class RunAdmin(OrgScopedAdmin):
    """Rows of an agent: changed by whoever may configure that agent."""

    add_action = change_action = Action.AGENT_CONFIGURE
    via = "agent"
    list_display = ["id", "agent", "status", "stop_reason", "created_at", "completed_at"]
    list_filter = ["status", "stop_reason", "background"]
    search_fields = ["id", "agent__name"]
    raw_id_fields = ["agent", "conversation"]
    list_select_related = ["agent"]


@admin.register(Step)
class StepAdmin(OrgScopedAdmin):
    """Rows of an agent: changed by whoever may configure that agent."""

    add_action = change_action = Action.AGENT_CONFIGURE
    via = "agent"
    list_display = [
        "id",
        "agent",
        "run",
        "model",
        "prompt_tokens",
        "completion_tokens",
        "latency_ms",
        "status",
        "feedback",
    ]
    list_filter = ["status", "stop_reason", "feedback", "model"]
    search_fields = ["id", "agent__name", "run__id"]
    raw_id_fields = ["agent", "run"]
    list_select_related = ["agent"]


class _ShownInline(admin.TabularInline):
    """Rows the group services keep consistent (speaking order, a turn's runs): shown, never edited here."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class GroupMemberInline(_ShownInline):
    model = GroupMember
    fields = readonly_fields = ("position", "agent")
    ordering = ["position"]


class GroupTurnRunInline(_ShownInline):
    model = GroupTurnRun
    fields = readonly_fields = ("position", "kind", "run", "carries_input")
    ordering = ["position"]


@admin.register(Group)
class GroupAdmin(OrgScopedAdmin):
    """Groups of agents (apps.agents.groups): members are changed through the API, which keeps the speaking
    order and the manager consistent; here the group is seen, described or deleted."""

    add_action = Action.GROUP_CREATE
    change_action = Action.GROUP_WRITE
    list_display = ["id", "manager_type", "description", "created_at"]
    list_filter = ["manager_type"]
    search_fields = ["id", "description"]
    fields = ["manager_type", "description", "manager_agent", "termination_token", "max_turns", "hidden"]
    readonly_fields = ["manager_type", "manager_agent", "termination_token", "max_turns"]
    inlines = [GroupMemberInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a group is made through /v1/groups, which checks its agents and configuration


@admin.register(GroupTurn)
class GroupTurnAdmin(OrgScopedAdmin):
    """One message to a group and its speakers' runs: a record, shown and never edited."""

    view_action = Action.GROUP_CREATE
    list_display = ["id", "group", "status", "stop_reason", "created_at", "completed_at"]
    list_filter = ["status", "stop_reason"]
    search_fields = ["id", "group__id"]
    raw_id_fields = ["group", "current_run"]
    inlines = [GroupTurnRunInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
