"""LLM call bodies stored zlib-compressed (migration llm 0003, apps.core.models.CompressedTextField): records
written before and after the migration read back as the text that was recorded, through the model and the
API, and the migration can be undone."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from apps.llm.models import LlmCall
from tests.support.migrations import migrated_from

# Backslashes, quotes, a NUL escape and non-ASCII: what a cast of text to bytea would mangle.
REQUEST = json.dumps(
    {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": 'C:\\tmp "quoted" \\u0000 héllo ✓ ' * 300}],
    }
)
RESPONSE = json.dumps({"choices": [{"message": {"role": "assistant", "content": "ok\\n"}}]})


def stored_bytes(record_id: str) -> bytes:
    with connection.cursor() as cursor:
        cursor.execute("SELECT request_body FROM llm_llmcall WHERE id = %s", [record_id])
        return bytes(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_records_from_before_and_after_the_migration_read_back_as_recorded(make_agent, actor, api_client_for):
    agent = make_agent(embedding="")
    api_client = api_client_for(actor)
    with migrated_from([("llm", "0002_llm_call_records")]) as (old_apps, forward):
        OldCall = old_apps.get_model("llm", "LlmCall")
        legacy = OldCall._default_manager.create(
            organization_id=agent.organization_id,
            agent_id=agent.id,
            request_body=REQUEST,
            response_body=RESPONSE,
        )
        forward()

        new = LlmCall.all_objects.create(
            organization_id=agent.organization_id,
            agent_id=agent.id,
            request_body=REQUEST,
            response_body=RESPONSE,
        )
        for record_id in (legacy.id, new.id):
            record = LlmCall.all_objects.get(id=record_id)
            assert (record.request_body, record.response_body) == (REQUEST, RESPONSE)
            body = api_client.get(f"/v1/llm-calls/{record_id}").json()
            assert (body["request_json"], body["response_json"]) == (REQUEST, RESPONSE)
        assert stored_bytes(legacy.id) == REQUEST.encode()  # not rewritten by the migration
        assert stored_bytes(new.id)[:1] == b"\x78"
        assert len(stored_bytes(new.id)) < len(REQUEST.encode()) / 10
        empty = LlmCall.all_objects.create(organization_id=agent.organization_id, agent_id=agent.id)
        assert LlmCall.all_objects.get(id=empty.id).request_body == ""
        assert stored_bytes(empty.id) == b""

        forward([("llm", "0002_llm_call_records")])  # undone: both rows are text again
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT request_body, response_body FROM llm_llmcall WHERE id IN (%s, %s)",
                [legacy.id, new.id],
            )
            assert cursor.fetchall() == [(REQUEST, RESPONSE), (REQUEST, RESPONSE)]
