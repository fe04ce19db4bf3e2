"""The file tools through the agent loop and the scripted LLM: grep, open and semantic search of an attached
folder's files, the `<directories>` section of the next request, least-recently-used closing, pathological
patterns, and what detaching takes away."""

from __future__ import annotations

import json

import pytest

from apps.agents.models import AgentTool
from apps.folders import services, tools
from apps.folders.models import AgentFile
from tests.folders import documents
from tests.support.scripted_llm import text, tool_call, tool_calls

FILE_TOOLS = {"open_files", "grep_files", "semantic_search_files"}


def tool_result(request: dict, index: int = -1) -> dict:
    """The payload of a tool message in a chat request (Letta's packaging: status, message, time)."""
    messages = [m for m in request["messages"] if m["role"] == "tool"]
    return json.loads(messages[index]["content"])


def system(request: dict) -> str:
    return request["messages"][0]["content"]


@pytest.fixture
def agent_with_files(actor, make_agent, folder, upload):
    upload(folder, "notes.txt", documents.TEXT)
    upload(folder, "report.pdf", documents.pdf([["Revenue grew in Lisbon", "Costs fell in Porto"]]))
    agent = make_agent(include_base_tools=False)
    services.agent_attach_folder(actor=actor, agent_id=agent.id, folder_id=folder.id)
    return agent


def test_attaching_a_folder_brings_the_file_tools_and_opens_its_files(actor, agent_with_files, send, llm):
    llm.push(text("hi"))

    send(agent_with_files, "hello")

    names = set(AgentTool.objects.filter(agent=agent_with_files).values_list("tool__name", flat=True))
    prompt = system(llm.last_chat_request())
    assert names >= FILE_TOOLS
    assert {t["function"]["name"] for t in llm.last_chat_request()["tools"]} >= FILE_TOOLS
    assert '<directory name="handbook">' in prompt
    assert '<file status="open" name="handbook/notes.txt">' in prompt
    assert (
        "[Viewing file start (out of 3 lines)]\n1: Line one about apples.\n2: Line two about pears." in prompt
    )
    assert "- current_files_open=2" in prompt


def test_an_agent_greps_opens_and_searches_a_file_through_the_loop(actor, agent_with_files, send, llm):
    services.agent_files_close_all(actor=actor, agent_id=agent_with_files.id)
    llm.push(
        tool_calls(tool_call("grep_files", {"pattern": "pears|plums", "context_lines": 0})),
        tool_calls(
            tool_call(
                "open_files",
                {"file_requests": [{"file_name": "handbook/notes.txt", "offset": 1, "length": 1}]},
            )
        ),
        tool_calls(tool_call("semantic_search_files", {"query": "Lisbon revenue", "limit": 1})),
        text("The report says revenue grew in Lisbon."),
    )

    result = send(agent_with_files, "What do the files say?")

    requests = llm.chat_requests()
    grep = tool_result(requests[1])
    opened = tool_result(requests[2])
    search = tool_result(requests[3])
    assert result.stop_reason == "end_turn"
    assert '<file status="closed" name="handbook/notes.txt">' in system(requests[0])
    assert grep["status"] == "OK"
    assert "2 matches for 'pears|plums' in 1 file(s)" in grep["message"]
    assert "=== handbook/notes.txt:2 ===\n> 2: Line two about pears." in grep["message"]
    assert opened["message"] == "Opened handbook/notes.txt (lines 2-2)"
    assert '<file status="open" name="handbook/notes.txt">' in system(requests[2])
    assert "[Viewing lines 2 to 2 (out of 3 lines)]\n2: Line two about pears.\n</value>" in system(
        requests[2]
    )
    assert "1: Line one about apples." not in system(requests[2])
    assert "=== handbook/report.pdf (passage #1" in search["message"]
    assert "Revenue grew in Lisbon" in search["message"]


def test_opening_past_max_files_open_closes_the_least_recently_used(
    actor, make_agent, folder, upload, send, llm
):
    for name in ("a.txt", "b.txt", "c.txt"):
        upload(folder, name, f"Contents of {name}\n".encode())
    agent = make_agent(include_base_tools=False)
    services.agent_set_file_limits(actor=actor, agent_id=agent.id, max_files_open=2)
    services.agent_attach_folder(actor=actor, agent_id=agent.id, folder_id=folder.id)
    services.agent_files_close_all(actor=actor, agent_id=agent.id)
    llm.push(
        tool_calls(tool_call("open_files", {"file_requests": [{"file_name": "handbook/a.txt"}]})),
        tool_calls(tool_call("open_files", {"file_requests": [{"file_name": "handbook/b.txt"}]})),
        tool_calls(tool_call("open_files", {"file_requests": [{"file_name": "handbook/c.txt"}]})),
        tool_calls(
            tool_call(
                "open_files",
                {
                    "file_requests": [
                        {"file_name": "handbook/a.txt"},
                        {"file_name": "handbook/b.txt"},
                        {"file_name": "handbook/c.txt"},
                    ]
                },
            )
        ),
        text("done"),
    )

    send(agent, "open them")

    third = tool_result(llm.chat_requests()[3])["message"]
    too_many = tool_result(llm.chat_requests()[4])
    open_now = set(
        AgentFile.objects.for_actor(actor)
        .filter(agent=agent, is_open=True)
        .values_list("file_name", flat=True)
    )
    assert third == (
        "Opened handbook/c.txt\nClosed 1 least recently used file(s) to stay within the open-file limit: handbook/a.txt"
    )
    assert too_many == {**too_many, "status": "Failed"}
    assert "at most 2 files may be open at once" in too_many["message"]
    assert open_now == {"handbook/b.txt", "handbook/c.txt"}
    assert "- max_files_open=2" in system(llm.last_chat_request())


def test_a_pathological_pattern_is_stopped_not_left_running(
    actor, make_agent, folder, upload, send, llm, monkeypatch
):
    monkeypatch.setattr(tools, "GREP_DEADLINE_SECONDS", 0.3)
    upload(folder, "evil.txt", b"a" * 5000 + b"!\n")
    agent = make_agent(include_base_tools=False)
    services.agent_attach_folder(actor=actor, agent_id=agent.id, folder_id=folder.id)
    llm.push(tool_calls(tool_call("grep_files", {"pattern": "(a|aa)+$"})), text("ok"))

    send(agent, "grep")

    answer = tool_result(llm.chat_requests()[1])
    assert answer["status"] == "Failed"
    assert answer["message"].startswith("The pattern took longer than 0.3 seconds")


def test_an_invalid_pattern_and_an_unknown_file_are_explained(agent_with_files, send, llm):
    llm.push(
        tool_calls(tool_call("grep_files", {"pattern": "("})),
        tool_calls(tool_call("open_files", {"file_requests": [{"file_name": "notes.txt"}]})),
        text("ok"),
    )

    send(agent_with_files, "try")

    bad_pattern = tool_result(llm.chat_requests()[1])["message"]
    unknown = tool_result(llm.chat_requests()[2])["message"]
    assert bad_pattern.startswith("Invalid regular expression for the pattern")
    assert unknown == (
        "notes.txt is not attached: check the name (<folder>/<file>). "
        "Attached files: handbook/notes.txt, handbook/report.pdf."
    )


def test_detaching_the_last_folder_takes_its_files_and_the_tools_away(
    actor, agent_with_files, folder, send, llm
):
    services.agent_detach_folder(actor=actor, agent_id=agent_with_files.id, folder_id=folder.id)
    llm.push(text("ok"))

    send(agent_with_files, "hi")

    names = set(AgentTool.objects.filter(agent=agent_with_files).values_list("tool__name", flat=True))
    assert names & FILE_TOOLS == set()
    assert not AgentFile.objects.for_actor(actor).filter(agent=agent_with_files).exists()
    assert "<directories>" not in system(llm.last_chat_request())


def test_a_replaced_file_keeps_its_window_with_the_new_text(
    actor, agent_with_files, folder, upload, send, llm
):
    upload(folder, "notes.txt", b"First new line.\nSecond new line.\n", duplicate_handling="replace")
    llm.push(text("ok"))

    send(agent_with_files, "hi")

    prompt = system(llm.last_chat_request())
    assert "1: First new line.\n2: Second new line." in prompt
    assert "Line one about apples" not in prompt
