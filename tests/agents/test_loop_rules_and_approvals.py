"""Tool rules and human approval through the real loop (scripted LLM over HTTP, local sandbox)."""

import pytest

from apps.agents.errors import NoPendingApproval, PendingApproval
from apps.agents.models import Message, Run
from apps.agents.services import MessageIn, agent_send_message
from apps.core.errors import InvalidInput
from tests.agents.test_loop import custom_tool
from tests.support.scripted_llm import text, tool_call, tool_calls


def offered(request):
    return sorted(t["function"]["name"] for t in request.get("tools") or [])


@pytest.fixture
def tools(org):
    return {name: custom_tool(org, name=name) for name in ("plan", "search", "report", "cleanup")}


def agent_with(make_agent, tools, rules, **kwargs):
    return make_agent(
        tool_ids=[t.id for t in tools.values()], tool_rules=rules, include_base_tools=False, **kwargs
    )


def test_run_first_forces_that_tool_on_the_first_call(make_agent, send, llm, tools):
    agent = agent_with(make_agent, tools, [{"type": "run_first", "tool_name": "plan"}])
    llm.push(tool_calls(tool_call("plan", {"word": "x"})), text("done"))

    send(agent, "go")

    first, second = llm.chat_requests()
    assert first["tool_choice"] == {"type": "function", "function": {"name": "plan"}}
    assert offered(first) == ["plan"]
    assert offered(second) == ["cleanup", "plan", "report", "search"]


def test_exit_loop_ends_the_turn_with_stop_reason_tool_rule(make_agent, send, llm, tools):
    agent = agent_with(make_agent, tools, [{"type": "exit_loop", "tool_name": "report"}])
    llm.push(tool_calls(tool_call("report", {"word": "final"})))

    result = send(agent, "go")

    assert result.stop_reason == "tool_rule"
    assert len(llm.chat_requests()) == 1


def test_continue_loop_and_constrain_child_tools_offer_only_the_children(make_agent, send, llm, tools):
    rules = [{"type": "constrain_child_tools", "tool_name": "search", "children": ["report"]}]
    agent = agent_with(make_agent, tools, rules)
    llm.push(
        tool_calls(tool_call("search", {"word": "q"})),
        tool_calls(tool_call("report", {"word": "r"})),
        text("done"),
    )

    send(agent, "go")

    assert offered(llm.chat_requests()[1]) == ["report"]


def test_a_call_outside_the_allowed_set_gets_an_error_return(make_agent, send, llm, tools):
    rules = [{"type": "constrain_child_tools", "tool_name": "search", "children": ["report"]}]
    agent = agent_with(make_agent, tools, rules)
    llm.push(
        tool_calls(tool_call("search", {"word": "q"})),
        tool_calls(tool_call("cleanup", {"word": "c"})),
        text("ok"),
    )

    result = send(agent, "go")

    cleanup = next(m for m in result.messages if m.role == "tool" and m.name == "cleanup")
    assert cleanup.is_err is True
    assert "report" in cleanup.tool_returns[0]["tool_return"]


def test_required_before_exit_keeps_the_loop_going_until_the_tool_is_called(make_agent, send, llm, tools):
    agent = agent_with(make_agent, tools, [{"type": "required_before_exit", "tool_name": "cleanup"}])
    llm.push(text("I am done"), tool_calls(tool_call("cleanup", {"word": "c"})), text("now done"))

    result = send(agent, "go")

    assert result.stop_reason == "end_turn"
    assert len(llm.chat_requests()) == 3
    nudge = llm.chat_requests()[1]["messages"][-1]
    assert "cleanup" in nudge["content"]


def test_max_count_per_step_removes_the_tool_once_used_up(make_agent, send, llm, tools):
    agent = agent_with(
        make_agent, tools, [{"type": "max_count_per_step", "tool_name": "search", "max_count_limit": 1}]
    )
    llm.push(tool_calls(tool_call("search", {"word": "a"})), text("done"))

    send(agent, "go")

    assert "search" in offered(llm.chat_requests()[0])
    assert "search" not in offered(llm.chat_requests()[1])


def test_conditional_routes_on_the_tool_output(make_agent, send, llm, tools):
    rules = [
        {
            "type": "conditional",
            "tool_name": "search",
            "child_output_mapping": {"FOUND": "report"},
            "default_child": "cleanup",
        }
    ]
    agent = agent_with(make_agent, tools, rules)
    llm.push(
        tool_calls(tool_call("search", {"word": "found"})),
        tool_calls(tool_call("report", {"word": "r"})),
        text("done"),
    )

    send(agent, "go")

    assert offered(llm.chat_requests()[1]) == ["report"]


def test_parent_last_tool_children_appear_only_right_after_the_parent(make_agent, send, llm, tools):
    rules = [{"type": "parent_last_tool", "tool_name": "plan", "children": ["report"]}]
    agent = agent_with(make_agent, tools, rules)
    llm.push(
        tool_calls(tool_call("plan", {"word": "p"})),
        tool_calls(tool_call("report", {"word": "r"})),
        text("done"),
    )

    send(agent, "go")

    assert "report" not in offered(llm.chat_requests()[0])
    assert offered(llm.chat_requests()[1]) == ["report"]


def test_tool_rules_are_described_to_the_model(make_agent, send, llm, tools):
    agent = agent_with(make_agent, tools, [{"type": "exit_loop", "tool_name": "report"}])
    llm.push(text("hi"))

    send(agent, "go")

    assert "<tool_usage_rules>" in llm.chat_requests()[0]["messages"][0]["content"]


def test_an_approved_call_runs_and_the_loop_continues(make_agent, send, llm, tools):
    agent = agent_with(make_agent, tools, [{"type": "requires_approval", "tool_name": "cleanup"}])
    llm.push(tool_calls(tool_call("cleanup", {"word": "disk"}, id="call_rm")))

    paused = send(agent, "clean up")
    llm.push(text("Cleaned."))
    resumed = send(agent, approvals=[{"type": "approval", "tool_call_id": "call_rm", "approve": True}])

    assert paused.stop_reason == "requires_approval"
    assert paused.run.status == Run.Status.COMPLETED
    assert paused.events[-3]["message_type"] == "approval_request_message"
    assert paused.events[-3]["tool_call"]["tool_call_id"] == "call_rm"
    assert resumed.stop_reason == "end_turn"
    tool_return = next(m for m in resumed.messages if m.role == "tool")
    assert tool_return.tool_returns[0]["tool_return"] == "DISK"
    assert llm.chat_requests()[1]["messages"][-1]["tool_call_id"] == "call_rm"


def test_a_denied_call_returns_the_reason_to_the_model(make_agent, send, llm, tools):
    agent = agent_with(make_agent, tools, [{"type": "requires_approval", "tool_name": "cleanup"}])
    llm.push(tool_calls(tool_call("cleanup", {"word": "disk"}, id="call_rm")))
    send(agent, "clean up")
    llm.push(text("Understood, I will not."))

    resumed = send(
        agent,
        approvals=[{"type": "approval", "tool_call_id": "call_rm", "approve": False, "reason": "not today"}],
    )

    tool_return = next(m for m in resumed.messages if m.role == "tool")
    assert tool_return.tool_returns[0] == {
        **tool_return.tool_returns[0],
        "status": "error",
        "tool_return": "Error: request to call tool denied. User reason: not today",
    }
    assert "not today" in llm.chat_requests()[1]["messages"][-1]["content"]


def test_a_message_while_approval_is_pending_is_refused(make_agent, send, llm, tools, actor):
    agent = agent_with(make_agent, tools, [{"type": "requires_approval", "tool_name": "cleanup"}])
    llm.push(tool_calls(tool_call("cleanup", {"word": "disk"}, id="call_rm")))
    paused = send(agent, "clean up")

    with pytest.raises(PendingApproval) as excinfo:
        agent_send_message(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hello?")])

    assert excinfo.value.pending_request_id == paused.messages[-1].id
    assert Message.all_objects.filter(agent=agent, role="user").count() == 1


def test_approvals_must_name_the_pending_calls(make_agent, send, llm, tools, actor):
    agent = agent_with(make_agent, tools, [{"type": "requires_approval", "tool_name": "cleanup"}])
    llm.push(tool_calls(tool_call("cleanup", {"word": "disk"}, id="call_rm")))
    send(agent, "clean up")

    with pytest.raises(InvalidInput, match="Invalid tool call IDs"):
        agent_send_message(
            actor=actor,
            agent_id=agent.id,
            approvals=[{"type": "approval", "tool_call_id": "call_other", "approve": True}],
        )


def test_an_approval_with_nothing_pending_is_refused(make_agent, actor, llm):
    agent = make_agent()

    with pytest.raises(NoPendingApproval):
        agent_send_message(
            actor=actor,
            agent_id=agent.id,
            approvals=[{"type": "approval", "tool_call_id": "x", "approve": True}],
        )


def test_a_tool_with_default_requires_approval_pauses_too(make_agent, send, llm, org):
    risky = custom_tool(org, name="risky", default_requires_approval=True)
    agent = make_agent(tool_ids=[risky.id])
    llm.push(tool_calls(tool_call("risky", {"word": "x"})))

    result = send(agent, "do it")

    assert result.stop_reason == "requires_approval"
    assert not Message.all_objects.filter(agent=agent, role="tool").exists()


def test_a_client_side_tool_is_executed_by_the_caller(make_agent, send, llm):
    agent = make_agent()
    client_tools = [
        {
            "name": "get_location",
            "description": "The user's location.",
            "parameters": {"type": "object", "properties": {}},
        }
    ]
    llm.push(tool_calls(tool_call("get_location", {}, id="call_loc")))

    paused = send(agent, "where am I?", client_tools=client_tools)
    llm.push(text("You are in Lyon."))
    resumed = send(
        agent,
        approvals=[
            {"type": "tool", "tool_call_id": "call_loc", "status": "success", "tool_return": "Lyon, France"}
        ],
    )

    assert "get_location" in offered(llm.chat_requests()[0])
    assert paused.stop_reason == "requires_approval"
    assert resumed.stop_reason == "end_turn"
    tool_message = next(m for m in resumed.messages if m.role == "tool")
    assert (tool_message.tool_returns[0]["tool_return"], tool_message.tool_returns[0]["sandbox"]) == (
        "Lyon, France",
        "client",
    )
