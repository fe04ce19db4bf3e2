"""The group page in a real browser: daphne, the WebSocket relay, a real Celery worker driving the group turn
against the scripted LLM. Each speaker's tokens show up, under its name, while its run is still going; the
page follows the next speaker's run as the turn moves on, without polling the turn."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect

from apps.agents.groups import group_create, group_turn_runs
from apps.agents.models import GroupTurn, Run
from apps.agents.services import BlockSpec, agent_create
from tests.ade.browser.conftest import Ade
from tests.support.scripted_llm import text

ALICE = "Alice speaks first, slowly, one word at a time, so that the page can show her words as they come."
BOB = "Bob answers after her, also slowly, so that the page must follow his run too before the turn ends."


def make_agent(ade: Ade, name: str):
    return agent_create(
        actor=ade.actor,
        name=name,
        model="openai/gpt-4o-mini",
        memory_blocks=[BlockSpec(label="human", value="", limit=2000)],
    )


def test_each_speaker_streams_under_its_name_and_the_page_follows_the_next(ade: Ade, llm, screenshot) -> None:
    alice, bob = make_agent(ade, "Alice"), make_agent(ade, "Bob")
    group = group_create(actor=ade.actor, agent_ids=[alice.id, bob.id], description="Streaming pair")
    llm.push(text(ALICE, chunk_delay=0.15), text(BOB, chunk_delay=0.1))
    page: Any = ade.page  # playwright.sync_api.Page
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.goto(ade.url(f"/groups/{group.id}/"))
    page.evaluate(
        """() => {
            window.seen = [];
            document.body.addEventListener("ade:group-run-event", (e) => window.seen.push(e.detail));
        }"""
    )

    box = page.get_by_test_id("composer-text")
    box.fill("introduce yourselves")
    page.get_by_test_id("send").click()

    live = page.locator(".group-turn .live-speaker")
    expect(live.first).to_contain_text(
        "Alice speaks first", timeout=30_000
    )  # the worker's first task warms up
    expect(live.first.get_by_test_id("speaker")).to_have_text("Alice")
    partial = live.first.locator(".ev-assistant .bubble").inner_text()
    assert ALICE.startswith(partial)
    assert partial != ALICE  # still streaming
    expect(page.get_by_test_id("run-active")).to_be_visible()
    screenshot(page, "group-streaming")

    # Alice's run ends: the page takes the turn's partial and follows Bob's run, also as it streams.
    bob_live = page.locator(f'.group-turn .live-speaker[data-speaker-id="{bob.id}"]')
    expect(bob_live).to_contain_text("Bob answers", timeout=20_000)
    expect(bob_live.get_by_test_id("speaker")).to_have_text("Bob")
    expect(page.get_by_test_id("stop-reason")).to_have_text("Turn ended", timeout=20_000)

    said = page.locator(".group-turn .group-msg:has(.ev-assistant)")
    expect(said).to_have_count(2)
    assert [said.nth(i).get_by_test_id("speaker").text_content() for i in range(2)] == ["Alice", "Bob"]
    assert [said.nth(i).locator(".ev-assistant .bubble").inner_text() for i in range(2)] == [ALICE, BOB]
    turn = GroupTurn.all_objects.get(group=group)
    runs = group_turn_runs(actor=ade.actor, turn=turn)
    assert [r.status for r in runs] == [Run.Status.COMPLETED] * 2
    assert [url.split("/ws/runs/")[1].split("/")[0] for url in sockets] == [r.id for r in runs]
    seen = page.evaluate("() => window.seen")
    assert {e["run_id"] for e in seen if e["event"]["message_type"] == "delta"} == {r.id for r in runs}

    page.reload()  # the history renders the same turn server-side, marked with the speakers
    history = page.locator("#group-timeline .group-msg:has(.ev-assistant)")
    expect(history).to_have_count(2)
    assert [history.nth(i).get_by_test_id("speaker").text_content() for i in range(2)] == ["Alice", "Bob"]
