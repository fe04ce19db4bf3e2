"""The agent loop through litellm and HTTP, against the scripted OpenAI-compatible server."""

import json

import pytest

from apps.agents.models import Message, Run, Step
from apps.agents.services import MessageIn, agent_send_message, run_cancel, run_create
from apps.streams.events import END_EVENT, read_events
from apps.tools.models import Tool
from tests.support.scripted_llm import error, text, tool_call, tool_calls

ECHO_SOURCE = '''
def echo(word: str) -> str:
    """Repeat a word back.

    Args:
        word (str): The word to repeat.

    Returns:
        str: The same word, upper-cased.
    """
    print("echoing", word)
    return word.upper()
'''


def custom_tool(org, name="echo", **fields):
    from apps.tools.schema import generate_schema

    source = fields.pop("source", ECHO_SOURCE.replace("def echo", f"def {name}"))
    return Tool.all_objects.create(
        organization=org,
        name=name,
        source_code=source,
        json_schema=generate_schema(source, name=name),
        **fields,
    )


def types(result):
    return [e["message_type"] for e in result.events]


def test_a_plain_reply_ends_the_turn_and_is_persisted(make_agent, send, llm):
    agent = make_agent()
    llm.push(text("Hello Sam!", reasoning="The user greeted me."))

    result = send(agent, "Hi, I am Sam")

    assert result.stop_reason == "end_turn"
    assert [m.role for m in result.messages] == ["assistant"]
    assert types(result) == ["reasoning_message", "assistant_message", "stop_reason", "usage_statistics"]
    assert result.run.status == Run.Status.COMPLETED
    agent.refresh_from_db()
    roles = list(
        Message.all_objects.filter(id__in=agent.message_ids)
        .order_by("sequence_id")
        .values_list("role", flat=True)
    )
    assert roles == ["user", "assistant"]
    step = Step.all_objects.get(run=result.run)
    assert step.prompt_tokens > 0
    assert step.request_json["messages"][-1] == {"role": "user", "content": "Hi, I am Sam"}


def test_the_system_message_carries_the_memory_blocks(make_agent, send, llm):
    agent = make_agent()
    llm.push(text("ok"))

    send(agent, "hello")

    system = llm.last_chat_request()["messages"][0]
    assert system["role"] == "system"
    assert "<human>" in system["content"]
    assert "Name: unknown" in system["content"]
    assert "chars_limit=2000" in system["content"]


def test_each_request_resends_the_stored_conversation_after_one_fresh_system_message(make_agent, send, llm):
    """The messages' JSON is kept per stored message across steps and runs (ChatRequest.messages_json);
    what the provider receives must still be the fresh system message, then the conversation as stored."""
    agent = make_agent()
    llm.push(text("Hello Sam!"), tool_calls(tool_call("memory_replace", {
        "label": "human", "old_string": "unknown", "new_string": "Sam"})), text("Noted."))  # fmt: skip

    send(agent, "Hi, I am Sam")
    send(agent, "Remember my name")

    first, second, third = llm.chat_requests()
    for body in (first, second, third):
        assert [m["role"] for m in body["messages"]].count("system") == 1
        assert body["messages"][0]["role"] == "system"
    assert second["messages"][1:] == [
        {"role": "user", "content": "Hi, I am Sam"},
        {"role": "assistant", "content": "Hello Sam!"},
        {"role": "user", "content": "Remember my name"},
    ]
    assert third["messages"][1:4] == second["messages"][1:]
    assert [m["role"] for m in third["messages"][4:]] == ["assistant", "tool"]
    assert "Name: Sam" in third["messages"][0]["content"]  # the edit, in the fresh system message
    assert "Name: Sam" not in second["messages"][0]["content"]


def test_a_custom_tool_runs_in_the_local_sandbox_and_the_loop_continues(make_agent, send, llm, org, settings):
    settings.SANDBOX_BACKEND = "local"  # the jail; Docker in the loop: tests/sandbox
    tool = custom_tool(org)
    agent = make_agent(tool_ids=[tool.id])
    llm.push(tool_calls(tool_call("echo", {"word": "hiking"}, id="call_1")), text("It says HIKING."))

    result = send(agent, "echo hiking")

    assert result.stop_reason == "end_turn"
    tool_message = next(m for m in result.messages if m.role == "tool")
    assert tool_message.tool_returns[0]["tool_return"] == "HIKING"
    assert tool_message.tool_returns[0]["stdout"] == ["echoing hiking"]
    assert tool_message.tool_returns[0]["sandbox"] == "local"
    second = llm.chat_requests()[1]["messages"]
    assert second[-1]["role"] == "tool"
    assert json.loads(second[-1]["content"])["message"] == "HIKING"


def test_a_tool_that_raises_gives_the_model_an_error_with_the_traceback(make_agent, send, llm, org):
    source = ECHO_SOURCE.replace("return word.upper()", "raise ValueError('no such word: ' + word)")
    tool = custom_tool(org, source=source)
    agent = make_agent(tool_ids=[tool.id])
    llm.push(tool_calls(tool_call("echo", {"word": "x"})), text("Sorry."))

    result = send(agent, "echo x")

    tool_return = next(e for e in result.events if e["message_type"] == "tool_return_message")
    assert tool_return["status"] == "error"
    assert "ValueError: no such word: x" in tool_return["tool_return"]
    assert result.stop_reason == "end_turn"


def test_parallel_tool_calls_all_run_in_order(make_agent, send, llm, org):
    tool = custom_tool(org)
    agent = make_agent(tool_ids=[tool.id], parallel_tool_calls=True)
    llm.push(tool_calls(tool_call("echo", {"word": "a"}), tool_call("echo", {"word": "b"})), text("done"))

    result = send(agent, "two")

    returns = [m.tool_returns[0]["tool_return"] for m in result.messages if m.role == "tool"]
    assert returns == ["A", "B"]
    assert llm.chat_requests()[0]["parallel_tool_calls"] is True


def test_malformed_tool_arguments_become_an_error_the_model_reads(make_agent, send, llm, org):
    tool = custom_tool(org)
    agent = make_agent(tool_ids=[tool.id])
    llm.push(tool_calls(tool_call("echo", '{"word": "unterminated')), text("I will fix that."))

    result = send(agent, "go")

    tool_message = next(m for m in result.messages if m.role == "tool")
    assert tool_message.is_err is True
    assert tool_message.tool_returns[0]["tool_return"].startswith("Invalid JSON in the arguments of echo")
    assert result.stop_reason == "end_turn"


def test_a_call_to_an_unknown_tool_is_an_error_return_not_a_crash(make_agent, send, llm):
    agent = make_agent()
    llm.push(tool_calls(tool_call("teleport", {"to": "mars"})), text("I cannot."))

    result = send(agent, "go")

    tool_message = next(m for m in result.messages if m.role == "tool")
    assert tool_message.is_err is True
    assert result.run.status == Run.Status.COMPLETED


def test_max_steps_stops_a_model_that_keeps_calling_tools(make_agent, send, llm, org):
    tool = custom_tool(org)
    agent = make_agent(tool_ids=[tool.id])
    llm.push(*[tool_calls(tool_call("echo", {"word": str(i)})) for i in range(3)])

    result = send(agent, "loop", max_steps=2)

    assert result.stop_reason == "max_steps"
    assert result.usage.step_count == 2
    assert len(llm.chat_requests()) == 2


def test_a_provider_500_is_retried_then_succeeds(make_agent, send, llm):
    agent = make_agent()
    llm.push(error(500, "upstream hiccup"), text("recovered"))

    result = send(agent, "hi")

    assert result.stop_reason == "end_turn"
    assert len(llm.chat_requests()) == 2
    assert Step.all_objects.get(run=result.run).status == Step.Status.SUCCESS


def test_a_provider_that_stays_down_stops_with_llm_api_error_and_the_agent_stays_usable(
    make_agent, send, llm
):
    agent = make_agent()
    llm.push(error(503, "down", times=3))

    failed = send(agent, "hi")
    llm.push(text("back again"))
    recovered = send(agent, "hello?")

    assert failed.stop_reason == "llm_api_error"
    assert failed.run.status == Run.Status.FAILED
    assert "down" in failed.run.error["message"]
    assert recovered.stop_reason == "end_turn"
    assert Message.all_objects.filter(agent=agent, role="user").count() == 2  # no user message was lost


def test_finish_reason_length_is_max_tokens_exceeded(make_agent, send, llm):
    agent = make_agent()
    llm.push(text("cut mid-sen", finish_reason="length"))

    result = send(agent, "write a novel")

    assert result.stop_reason == "max_tokens_exceeded"


def test_a_cancelled_run_does_not_start(make_agent, actor, llm):
    agent = make_agent()
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi")])

    run_cancel(actor=actor, run_id=run.id)
    from apps.agents.loop.runner import execute_run

    assert execute_run(run.id) is None
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert llm.chat_requests() == []


def test_cancelling_a_run_no_worker_has_claimed_closes_its_stream(make_agent, actor, llm):
    """Nobody will ever execute it, so a client following its stream must get the end from the cancel."""
    agent = make_agent()
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi")], stream_tokens=True)

    run_cancel(actor=actor, run_id=run.id)

    events = [event.data for event in read_events(run.id)]
    assert events[-1]["message_type"] == END_EVENT
    assert (events[-1]["status"], events[-1]["stop_reason"]) == ("cancelled", "cancelled")
    run.refresh_from_db()
    assert run.completed_at is not None


def test_a_cancel_during_the_final_reply_ends_the_stream_as_cancelled(
    make_agent, actor, send, llm, monkeypatch
):
    """The reply is not interrupted mid-stream, but the run, its stop reason and its end event all say
    cancelled: the user's cancel wins over the loop's own end_turn."""
    from apps.agents.loop import runner

    agent = make_agent()
    llm.push(text("a long answer"))
    call_llm = runner._call_llm

    def cancelled_meanwhile(state, *args, **kwargs):
        response = call_llm(state, *args, **kwargs)
        run_cancel(actor=actor, run_id=state.run.id)  # the user clicks Stop while the reply streams
        return response

    monkeypatch.setattr(runner, "_call_llm", cancelled_meanwhile)

    result = send(agent, "tell me everything")

    assert result.stop_reason == "cancelled"
    assert result.run.status == Run.Status.CANCELLED
    assert {"message_type": "stop_reason", "stop_reason": "cancelled"} in result.events
    result.run.refresh_from_db()
    assert (result.run.status, result.run.stop_reason) == ("cancelled", "cancelled")


def test_an_unknown_model_handle_fails_the_run_clearly(make_agent, send, llm):
    agent = make_agent(model="nowhere/model-x")

    result = send(agent, "hi")

    assert result.run.status == Run.Status.FAILED
    assert result.stop_reason == "llm_api_error"
    assert "nowhere" in result.run.error["message"]


def test_an_empty_send_is_refused(make_agent, actor):
    agent = make_agent()

    with pytest.raises(Exception, match="at least one message"):
        agent_send_message(actor=actor, agent_id=agent.id, messages=[])

    assert Run.all_objects.filter(agent=agent).count() == 0
