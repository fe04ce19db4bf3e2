from datetime import UTC, datetime
from types import SimpleNamespace

from apps.agents.loop.convert import to_letta_messages, to_llm_messages


def stored(role, **fields):
    defaults = dict(
        id="message-1",
        content=[],
        text="",
        name="",
        tool_calls=None,
        tool_call_id="",
        tool_returns=None,
        approvals=None,
        approve=None,
        approval_request_id="",
        denial_reason="",
        otid="",
        sender_id="",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        run_id="run-1",
        step_id=None,
        is_err=False,
        sequence_id=7,
    )
    return SimpleNamespace(role=role, **{**defaults, **fields})


def test_an_assistant_message_with_only_reasoning_is_not_sent_to_the_llm():
    message = stored("assistant", content=[{"type": "reasoning", "reasoning": "hmm"}])

    assert to_llm_messages([message]) == []


def test_tool_calls_and_returns_keep_openai_shape():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        stored("assistant", tool_calls=[call]),
        stored("tool", tool_call_id="c1", content=[{"type": "text", "text": '{"status": "OK"}'}]),
    ]

    assert to_llm_messages(messages) == [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "OK"}'},
    ]


def test_an_assistant_turn_becomes_reasoning_tool_call_and_assistant_messages_with_one_id():
    call = {"id": "c1", "type": "function", "function": {"name": "memory_insert", "arguments": '{"x": 1}'}}
    message = stored(
        "assistant",
        content=[{"type": "reasoning", "reasoning": "think"}, {"type": "text", "text": "Done"}],
        tool_calls=[call],
    )

    letta = to_letta_messages(message)

    assert [m["message_type"] for m in letta] == [
        "reasoning_message",
        "tool_call_message",
        "assistant_message",
    ]
    assert {m["id"] for m in letta} == {"message-1"}
    assert letta[1]["tool_call"] == {"name": "memory_insert", "arguments": '{"x": 1}', "tool_call_id": "c1"}


def test_send_message_of_legacy_agents_shows_as_the_assistant_message():
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "send_message", "arguments": '{"message": "Hello!"}'},
    }

    letta = to_letta_messages(stored("assistant", tool_calls=[call]))

    assert [(m["message_type"], m.get("content")) for m in letta] == [("assistant_message", "Hello!")]
