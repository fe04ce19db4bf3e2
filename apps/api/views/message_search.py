"""POST /v1/messages/search (the SDK's messages.search): an organisation's messages ranked by keywords,
meaning or both, as Letta's LettaMessageSearchResult list. A thin adapter over the agents' recall search
(apps.agents.selectors.organization_search)."""

from __future__ import annotations

from typing import Any

from django.urls import re_path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents.models import Message
from apps.agents.selectors import RECALL_MAX_LIMIT, RECALL_SEARCH_MODES, organization_search
from apps.agents.wire import to_letta_messages
from apps.api.base import OrgApiView

SEARCH_RESULT_TYPES = {
    "system_message": "content",
    "user_message": "content",
    "reasoning_message": "reasoning",
    "assistant_message": "content",
}
"""Letta returns these four message types (with their text field); tool calls and returns are left out."""


class MessageSearchIn(serializers.Serializer):
    """Letta's SearchAllMessagesRequest."""

    query = serializers.CharField()
    search_mode = serializers.ChoiceField(choices=RECALL_SEARCH_MODES, default="hybrid")
    agent_id = serializers.CharField(required=False, allow_null=True)
    conversation_id = serializers.CharField(required=False, allow_null=True)
    limit = serializers.IntegerField(min_value=1, max_value=RECALL_MAX_LIMIT, default=50)
    start_date = serializers.DateTimeField(required=False, allow_null=True)
    end_date = serializers.DateTimeField(required=False, allow_null=True)


def search_results(message: Message) -> list[dict[str, Any]]:
    """A stored message as Letta's search result items (one per LettaMessage of a searchable type)."""
    items = []
    for letta_message in to_letta_messages(message):
        field = SEARCH_RESULT_TYPES.get(letta_message["message_type"])
        if field is None:
            continue
        items.append(
            {
                "message_id": message.id,
                "message_type": letta_message["message_type"],
                field: letta_message.get(field),
                "agent_id": message.agent_id,
                "conversation_id": message.conversation_id,
                "created_at": message.created_at.isoformat(),
            }
        )
    return items


class MessageSearchApi(OrgApiView):
    @extend_schema(operation_id="search_all_messages", request=MessageSearchIn, responses={200: dict})
    def post(self, request: Request) -> Response:
        data = MessageSearchIn(data=request.data)
        data.is_valid(raise_exception=True)
        params = data.validated_data
        hits = organization_search(
            actor=self.actor,
            query=params["query"],
            search_mode=params["search_mode"],
            agent_id=params.get("agent_id") or None,
            conversation_id=params.get("conversation_id") or None,
            limit=params["limit"],
            start=params.get("start_date"),
            end=params.get("end_date"),
        )
        return Response([item for message, _ranks in hits for item in search_results(message)])


urlpatterns = [
    re_path(r"^v1/messages/search/?$", MessageSearchApi.as_view(), name="messages-search"),
]
