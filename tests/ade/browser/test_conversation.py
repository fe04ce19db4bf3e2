"""The conversation column in a real browser: daphne, the WebSocket relay, a real Celery worker running the
loop against the scripted LLM. Tokens must show up while the run is still going."""

from __future__ import annotations

import re
from typing import cast

from playwright.sync_api import Page, expect

from apps.agents.models import Run
from apps.agents.services import BlockSpec, agent_create
from apps.memory.models import Block
from tests.ade.browser.conftest import Ade
from tests.support.scripted_llm import text, tool_call, tool_calls

REPLY = (
    "Sure thing. Here is a slow answer that arrives one word at a time so that you can watch it grow "
    "before the run completes at the very end."
)


def make_agent(ade: Ade, **kwargs):
    return agent_create(
        actor=ade.actor,
        name=kwargs.pop("name", "Streamer"),
        model="openai/gpt-4o-mini",
        memory_blocks=[BlockSpec(label="human", value="Name: Ada", limit=2000)],
        **kwargs,
    )


def send(page, message: str) -> None:
    box = page.get_by_test_id("composer-text")
    box.fill(message)
    box.press("Enter")


def test_streamed_text_appears_before_the_run_completes(ade: Ade, llm, screenshot) -> None:
    agent = make_agent(ade)
    llm.push(text(REPLY, reasoning="The user wants a long answer.", chunk_delay=0.1))
    page = ade.page
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.goto(ade.url(f"/agents/{agent.id}/"))
    page.evaluate(
        """() => {
            window.seen = {events: [], ends: []};
            document.body.addEventListener("ade:run-event", (e) => window.seen.events.push(e.detail));
            document.body.addEventListener("ade:run-end", (e) => window.seen.ends.push(e.detail));
        }"""
    )

    box = page.get_by_test_id("composer-text")
    box.fill("Tell me something")
    box.press("Shift+Enter")  # a new line, not a send
    box.type("slowly")
    assert box.input_value() == "Tell me something\nslowly"
    box.press("Enter")

    bubble = page.locator(".turn .ev-assistant .bubble").last
    expect(bubble).to_contain_text(
        "Here is a slow answer", timeout=30_000
    )  # the worker's first task warms up
    partial = bubble.inner_text()
    expect(page.get_by_test_id("run-active")).to_be_visible()  # still running
    expect(page.get_by_test_id("composer-text")).to_be_disabled()
    expect(page.get_by_test_id("stop")).to_be_visible()
    assert "the very end." not in partial
    assert Run.all_objects.get(agent=agent).status in (Run.Status.CREATED, Run.Status.RUNNING)
    expect(page.locator(".turn .ev-user .bubble").last).to_have_text("Tell me something\nslowly")
    screenshot(page, "conversation-streaming")

    # The socket drops mid-stream: the page reconnects from its last cursor, without gaps or repeats.
    page.evaluate("() => { for (const entry of window.adeConversation.sockets.values()) entry.ws.close(); }")
    expect(bubble).to_contain_text("watch it grow")
    assert REPLY.startswith(bubble.inner_text())
    assert len(sockets) == 2
    assert "after=0-0" in sockets[0]
    assert "after=0-0" not in sockets[1]  # resumed from the last event it saw

    expect(page.get_by_test_id("stop-reason")).to_have_text("Turn ended", timeout=20_000)
    expect(page.locator(".turn .ev-assistant .bubble").last).to_have_text(REPLY)
    expect(page.locator(".turn .ev-reasoning").last).to_contain_text("The user wants a long answer.")
    expect(page.get_by_test_id("usage")).to_contain_text("tokens")
    expect(page.get_by_test_id("composer-text")).to_be_enabled()
    expect(page.get_by_test_id("stop")).to_be_hidden()
    run = Run.all_objects.get(agent=agent)
    assert run.status == Run.Status.COMPLETED
    seen = page.evaluate("() => window.seen")
    assert seen["ends"] == [{"run_id": run.id, "status": "completed", "stop_reason": "end_turn"}]
    kinds = {e["event"]["message_type"] for e in seen["events"]}
    assert {"delta", "reasoning_message", "assistant_message", "stop_reason", "usage_statistics"} <= kinds
    assert {e["run_id"] for e in seen["events"]} == {run.id}

    page.reload()  # the history renders the same turn server-side
    expect(page.locator(".turn .ev-assistant .bubble").last).to_have_text(REPLY)
    expect(page.get_by_test_id("stop-reason")).to_have_text("Turn ended")
    for width in (1280, 1920):
        page.set_viewport_size({"width": width, "height": 900})
        expect(page.get_by_test_id("send")).to_be_in_viewport()
        screenshot(page, f"conversation-{width}")


def test_a_socket_that_goes_silent_without_closing_is_replaced(ade: Ade, llm) -> None:
    # A web host that vanishes without a FIN leaves the browser's socket open and silent: the relay's
    # pings stop too. The page must drop it and resume from its cursor on a new one, not wait for TCP.
    agent = make_agent(ade)
    llm.push(text(REPLY, chunk_delay=0.15))
    page = cast(Page, ade.page)
    urls: list[str] = []

    def relay(route) -> None:
        first = not urls
        urls.append(route.url)
        server = route.connect_to_server()
        forwarded = 0

        def from_server(message) -> None:
            nonlocal forwarded
            if first and forwarded >= 3:
                return  # the host is gone: nothing more arrives
            forwarded += '"cursor"' in message
            route.send(message)

        server.on_message(from_server)
        if first:
            server.on_close(lambda code, reason: None)  # and no close reaches the page either

    page.route_web_socket(re.compile(r"/ws/runs/"), relay)
    page.goto(ade.url(f"/agents/{agent.id}/"))
    send(page, "Tell me something")
    # Once events flow (a cursor seen: the run started), shorten the page's patience from 35 s.
    page.wait_for_function(
        "() => [...window.adeConversation.sockets.values()].some((s) => s.cursor !== '0-0')", timeout=30_000
    )
    page.evaluate("() => { document.body.dataset.wsSilenceMs = '2000'; }")

    expect(page.get_by_test_id("stop-reason")).to_have_text("Turn ended", timeout=30_000)
    expect(page.locator(".turn .ev-assistant .bubble").last).to_have_text(REPLY)  # no gap, no repeat
    assert len(urls) == 2
    assert "after=0-0" in urls[0]
    assert "after=0-0" not in urls[1]  # resumed from the last event seen


def test_approve_one_tool_call_and_deny_another(ade: Ade, llm, screenshot) -> None:
    agent = make_agent(
        ade, name="Careful", tool_rules=[{"type": "requires_approval", "tool_name": "memory_insert"}]
    )
    llm.push(
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "Likes tea"}, id="call_tea")),
        text("Saved that you like tea."),
        tool_calls(
            tool_call("memory_insert", {"label": "human", "new_string": "Hates coffee"}, id="call_coffee")
        ),
        text("All right, I will not write that down."),
    )
    page = ade.page
    page.goto(ade.url(f"/agents/{agent.id}/"))
    human = Block.all_objects.get(agents=agent, label="human")

    send(page, "Remember that I like tea")
    card = page.locator("[data-testid=approval-card].pending")
    expect(card.get_by_test_id("approve")).to_be_visible(timeout=20_000)
    expect(card).to_contain_text("memory_insert")
    expect(card).to_contain_text('"new_string": "Likes tea"')
    expect(page.get_by_test_id("stop-reason").last).to_have_text("Waiting for approval")
    expect(page.locator("[data-role=approval-hint]")).to_be_visible()
    screenshot(page, "conversation-approval")

    card.get_by_test_id("approve").click()
    expect(page.locator(".ev-decision").last).to_contain_text("Approved")
    expect(page.locator(".turn .ev-assistant .bubble").last).to_have_text(
        "Saved that you like tea.", timeout=20_000
    )
    expect(page.locator(".turn").last.locator(".ev-tool-return .badge")).to_have_text("success")
    expect(page.get_by_test_id("stop-reason").last).to_have_text("Turn ended")
    human.refresh_from_db()
    assert "Likes tea" in human.value

    send(page, "Also remember that I hate coffee")
    expect(card.get_by_test_id("deny")).to_be_visible(timeout=20_000)
    card.get_by_test_id("deny-reason").fill("Keep my coffee opinions private")
    card.get_by_test_id("deny").click()
    expect(page.locator(".ev-decision").last).to_contain_text("Denied")
    expect(page.locator(".ev-decision").last).to_contain_text("Keep my coffee opinions private")
    expect(page.locator(".turn .ev-assistant .bubble").last).to_have_text(
        "All right, I will not write that down.", timeout=20_000
    )
    expect(page.locator(".turn").last.locator(".ev-tool-return .badge")).to_have_text("error")
    human.refresh_from_db()
    assert "Hates coffee" not in human.value
    assert page.locator("[data-testid=approval-card].pending").count() == 0


def test_a_message_while_an_approval_waits_is_explained(ade: Ade, llm) -> None:
    agent = make_agent(
        ade, name="Waiting", tool_rules=[{"type": "requires_approval", "tool_name": "memory_insert"}]
    )
    llm.push(tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "x"})))
    page = ade.page
    page.goto(ade.url(f"/agents/{agent.id}/"))

    send(page, "Remember x")
    expect(page.get_by_test_id("approve")).to_be_visible(timeout=20_000)
    send(page, "Hello?")

    expect(page.get_by_test_id("composer-notice")).to_contain_text("waiting for your approval")
    expect(page.get_by_test_id("composer-text")).to_have_value("Hello?")  # nothing lost


def test_cancel_a_running_turn(ade: Ade, llm) -> None:
    agent = make_agent(ade, name="Slow")
    llm.push(
        tool_calls(
            tool_call("memory_insert", {"label": "human", "new_string": "never written"}),
            text=" ".join(["thinking"] * 40),
            chunk_delay=0.1,
        )
    )
    page = ade.page
    page.goto(ade.url(f"/agents/{agent.id}/"))

    send(page, "Do something long")
    expect(page.locator(".turn .ev-assistant .bubble").last).to_contain_text("thinking")
    page.get_by_test_id("stop").click()  # the composer's Stop cancels the live turn

    expect(page.get_by_test_id("stop-reason")).to_have_text("Cancelled", timeout=20_000)
    expect(page.get_by_test_id("composer-text")).to_be_enabled()
    run = Run.all_objects.get(agent=agent)
    assert run.status == Run.Status.CANCELLED
    assert "never written" not in Block.all_objects.get(agents=agent, label="human").value


def test_new_conversation_is_kept_in_the_address_and_switching_back_shows_the_default(ade: Ade, llm) -> None:
    agent = make_agent(ade, name="Threads")
    llm.push(text("Default thread reply."), text("New thread reply."))
    page = ade.page
    page.goto(ade.url(f"/agents/{agent.id}/"))
    send(page, "first")
    expect(page.get_by_test_id("stop-reason")).to_have_text("Turn ended", timeout=20_000)

    page.get_by_test_id("conversation-new").click()
    expect(page).to_have_url(re.compile(r"\?conversation=conv"))
    expect(page.locator(".timeline-empty")).to_be_visible()
    send(page, "second")
    expect(page.locator(".turn .ev-assistant .bubble").last).to_have_text("New thread reply.", timeout=20_000)

    page.reload()
    expect(page.locator(".turn .ev-assistant .bubble")).to_have_text(["New thread reply."])
    page.get_by_test_id("conversation-switch").select_option("")
    expect(page.locator(".turn .ev-assistant .bubble")).to_have_text(["Default thread reply."])
    expect(page).not_to_have_url(re.compile("conversation="))
