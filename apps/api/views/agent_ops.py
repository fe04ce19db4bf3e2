"""/v1/agents/{agent_id}: recompile (and its deprecated /system-prompt/recompile alias), summarize
(`agents.messages.compact`) and generate.

Decisions a client can observe:
- Recompile answers the system message as a JSON string, compiled from the agent's current memory, and
  stores it as the thread's system message (what `messages.list` starts with) unless `dry_run`. The loop
  compiles it afresh for every LLM call anyway; `update_timestamp` changes nothing.
- Summarize and compaction call the agent's model in the request (as Letta does) while holding the
  thread's lock: a run of that thread waits meanwhile, and compaction during a run is a 409.
- A failing provider (after retries, within LLM_CALL_DEADLINE) is a 502 `LLM provider error: ...`.
"""

from __future__ import annotations

from django.urls import re_path
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import services as agent_services
from apps.api.base import OrgApiView
from apps.api.serializers import conversations as s
from apps.llm.errors import LLMError

AGENT = r"(?P<agent_id>[^/]+)"


def llm_error_response(exc: LLMError) -> Response:
    """Letta's answer when the provider fails a call made in the request (generate, compaction)."""
    return Response({"detail": f"LLM provider error: {exc.message}"}, status=status.HTTP_502_BAD_GATEWAY)


class AgentRecompileApi(OrgApiView):
    @extend_schema(
        operation_id="recompile_agent", parameters=[s.RecompileQueryIn], request=None, responses=str
    )
    def post(self, request: Request, agent_id: str) -> Response:
        query = s.RecompileQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(
            agent_services.thread_recompile(
                actor=self.actor, agent_id=agent_id, dry_run=query.validated_data["dry_run"]
            )
        )


class AgentSystemPromptRecompileApi(AgentRecompileApi):
    """Deprecated alias of POST /v1/agents/{agent_id}/recompile."""

    @extend_schema(
        operation_id="recompile_agent_system_prompt",
        parameters=[s.RecompileQueryIn],
        request=None,
        responses=str,
        deprecated=True,
    )
    def post(self, request: Request, agent_id: str) -> Response:
        return super().post(request, agent_id)


class AgentSummarizeApi(OrgApiView):
    @extend_schema(
        operation_id="summarize_messages", request=s.CompactionRequestIn, responses=s.CompactionOut
    )
    def post(self, request: Request, agent_id: str) -> Response:
        data = s.CompactionRequestIn(data=request.data or {})
        data.is_valid(raise_exception=True)
        try:
            compaction = agent_services.agent_summarize(
                actor=self.actor, agent_id=agent_id, compaction_settings=data.settings()
            )
        except LLMError as exc:
            return llm_error_response(exc)
        return Response(s.compaction_out(compaction))


class AgentGenerateApi(OrgApiView):
    @extend_schema(operation_id="generate_completion", request=s.GenerateIn, responses=s.GenerateOut)
    def post(self, request: Request, agent_id: str) -> Response:
        data = s.GenerateIn(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            generation = agent_services.agent_generate(
                actor=self.actor,
                agent_id=agent_id,
                prompt=data.validated_data["prompt"],
                system_prompt=data.validated_data.get("system_prompt") or None,
                override_model=data.validated_data.get("override_model") or None,
                response_schema=data.validated_data.get("response_schema"),
            )
        except LLMError as exc:
            return llm_error_response(exc)
        return Response(s.GenerateOut(generation).data)


urlpatterns = [
    re_path(rf"^v1/agents/{AGENT}/recompile/?$", AgentRecompileApi.as_view(), name="agent-recompile"),
    re_path(
        rf"^v1/agents/{AGENT}/system-prompt/recompile/?$",
        AgentSystemPromptRecompileApi.as_view(),
        name="agent-system-prompt-recompile",
    ),
    re_path(rf"^v1/agents/{AGENT}/summarize/?$", AgentSummarizeApi.as_view(), name="agent-summarize"),
    re_path(rf"^v1/agents/{AGENT}/generate/?$", AgentGenerateApi.as_view(), name="agent-generate"),
]
