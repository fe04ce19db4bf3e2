"""The memory column in a real browser: the agent's own memory edits appear live during a turn, a person's
edit reaches the next LLM request, archival memory is added to and searched."""

from __future__ import annotations

import re
import time
from typing import Any

from playwright.sync_api import expect

from apps.agents.models import Agent, Run
from apps.agents.services import BlockSpec, agent_create
from tests.ade.browser.conftest import Ade
from tests.support.scripted_llm import ScriptedLLM


def _agent(ade: Ade) -> Agent:
    return agent_create(
        actor=ade.actor,
        name="Memo",
        model="openai/gpt-4o-mini",
        embedding="openai/text-embedding-3-small",
        memory_blocks=[
            BlockSpec(label="human", value="Name: unknown", limit=2000),
            BlockSpec(label="persona", value="I am Memo, a helpful assistant.", limit=2000),
        ],
    )


def _send(page: Any, text: str) -> str:
    """Send through the conversation column's composer, as a person would; returns the run id. The
    conversation column follows the run and tells the memory column about its events. The new turn may
    already have ended when the page renders it (a quick scripted reply), so it is found by count, not by
    being live."""
    turns = page.locator(".turn[data-run-id]")
    before = turns.count()
    page.get_by_test_id("composer-text").fill(text)
    page.get_by_test_id("send").click()
    expect(turns).to_have_count(before + 1)
    return turns.last.get_attribute("data-run-id")


def _tokens(page: Any, section: str) -> int:
    return int(page.get_by_test_id(f"ctx-{section}").get_attribute("data-tokens"))


def _wait_for_chat_requests(llm: ScriptedLLM, count: int, timeout: float = 15.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        requests = llm.chat_requests()
        if len(requests) >= count:
            return requests
        time.sleep(0.1)
    raise AssertionError(f"the scripted LLM got {len(llm.chat_requests())} chat requests, expected {count}")


def _wait_for_run_end(ade: Ade, agent: Agent, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Run.objects.for_actor(ade.actor).filter(agent=agent, completed_at__isnull=True).exists():
            return
        ade.page.wait_for_timeout(100)
    raise AssertionError("the run did not finish")


def test_a_block_the_agent_edits_during_a_turn_updates_live_in_the_panel_and_the_context_viewer(
    ade: Ade, llm: ScriptedLLM, screenshot
) -> None:
    agent = _agent(ade)
    new_value = "Name: Ada Lovelace. Mathematician; writes the first programs; likes tea and long walks."
    llm.push(
        llm.tool_calls(
            llm.tool_call(
                "memory_replace", {"label": "human", "old_string": "Name: unknown", "new_string": new_value}
            )
        ),
        llm.text("Nice to meet you, Ada!", latency=4),
    )
    page = ade.page
    page.goto(ade.url(f"/agents/{agent.id}/"))
    block = page.get_by_test_id("block-human")
    expect(block.locator("textarea.mem-value")).to_have_value("Name: unknown")
    blocks_before = _tokens(page, "memory_blocks")

    _send(page, "Hi, I am Ada Lovelace.")

    expect(block.locator("textarea.mem-value")).to_have_value(new_value, timeout=6_000)
    expect(block).to_have_class(re.compile(r"\bmem-changed\b"))
    expect(block.get_by_test_id("char-count")).to_contain_text(f"{len(new_value)} / 2000")
    # Live, during the turn: the model's final reply is still 4 seconds away.
    assert Run.objects.for_actor(ade.actor).get(agent=agent).status == Run.Status.RUNNING
    page.wait_for_function(
        "before => Number(document.querySelector('[data-testid=ctx-memory_blocks]').dataset.tokens) > before",
        arg=blocks_before,
    )
    _wait_for_run_end(ade, agent)
    expect(page.get_by_test_id("ctx-messages")).not_to_have_text("0")
    screenshot(page, "memory-column-live-edit")


def test_a_block_edited_by_hand_is_in_the_next_llm_request_and_its_history_shows_the_diff(
    ade: Ade, llm: ScriptedLLM, screenshot
) -> None:
    agent = _agent(ade)
    page = ade.page
    page.goto(ade.url(f"/agents/{agent.id}/"))
    block = page.get_by_test_id("block-human")
    editor = block.locator("textarea.mem-value")

    editor.fill("Name: Grace Hopper\nRear admiral, compiler pioneer")
    expect(block.get_by_test_id("char-count")).to_contain_text("49 / 2000")
    block.get_by_role("button", name="Save").click()

    expect(block.get_by_test_id("block-saved")).to_have_text("Saved · version 2")
    llm.push(llm.text("Hello Grace!"))
    _send(page, "Who am I?")
    [request] = _wait_for_chat_requests(llm, 1)
    system = request["messages"][0]["content"]
    assert "Name: Grace Hopper\nRear admiral, compiler pioneer" in system
    assert "Name: unknown" not in system
    _wait_for_run_end(ade, agent)

    block.get_by_test_id("history-button").click()
    history = block.get_by_test_id("block-history")
    expect(history.locator(".mem-version").first).to_contain_text(f"User {ade.user.username}")
    expect(history.locator(".d-del").first).to_have_text("- Name: unknown")
    expect(history.locator(".d-add").nth(1)).to_have_text("+ Rear admiral, compiler pioneer")
    screenshot(page, "memory-block-history")

    page.once("dialog", lambda dialog: dialog.accept())
    history.get_by_test_id("restore-v1").click()
    expect(editor).to_have_value("Name: unknown")
    expect(block.get_by_test_id("block-saved")).to_have_text("Saved · version 3")


def test_an_edit_is_not_clobbered_when_the_agent_changes_the_block_meanwhile(
    ade: Ade, llm: ScriptedLLM
) -> None:
    agent = _agent(ade)
    llm.push(
        llm.tool_calls(
            llm.tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Ada"})
        ),
        llm.text("Noted."),
    )
    page = ade.page
    page.goto(ade.url(f"/agents/{agent.id}/"))
    block = page.get_by_test_id("block-human")
    editor = block.locator("textarea.mem-value")
    editor.fill("Name: Grace")

    _send(page, "I am Ada")

    expect(block.locator(".mem-stale")).to_contain_text("Changed meanwhile (now version 2)", timeout=10_000)
    expect(editor).to_have_value("Name: Grace")
    block.get_by_role("button", name="Save").click()
    expect(block.get_by_test_id("block-conflict")).to_contain_text(
        "this block changed while you were editing"
    )
    expect(editor).to_have_value("Name: Ada")
    block.get_by_text("Your unsaved text").click()
    block.get_by_role("button", name="Put my text back in the editor").click()
    expect(editor).to_have_value("Name: Grace")
    block.get_by_role("button", name="Save").click()
    expect(block.get_by_test_id("block-saved")).to_have_text("Saved · version 3")


def test_adding_and_searching_archival_passages(ade: Ade, llm: ScriptedLLM, screenshot) -> None:
    agent = _agent(ade)
    page = ade.page
    page.goto(ade.url(f"/agents/{agent.id}/"))
    section = page.get_by_test_id("archival-section")
    section.locator("summary").first.click()
    panel = page.get_by_test_id("archival-panel")
    expect(panel).to_contain_text("No passages yet")
    passages_before = _tokens(page, "metadata")

    for text, tags in (("Ada's cat is called Pixel", "pets, family"), ("The report is due in March", "work")):
        # The form is re-rendered after each save: open it again.
        page.get_by_test_id("archival-panel").get_by_text("Add a passage").click()
        form = page.get_by_test_id("archival-add")
        form.locator("textarea[name=text]").fill(text)
        form.locator("input[name=tags]").fill(tags)
        form.get_by_role("button", name="Save passage").click()
        expect(page.get_by_test_id("archival-results")).to_contain_text(text)

    results = page.get_by_test_id("archival-results")
    expect(results.get_by_test_id("passage")).to_have_count(2)
    # Passages are listed in the system message's memory metadata: the viewer follows.
    page.wait_for_function(
        "before => Number(document.querySelector('[data-testid=ctx-metadata]').dataset.tokens) > before",
        arg=passages_before,
    )

    panel = page.get_by_test_id("archival-panel")
    panel.get_by_placeholder("Search by meaning…").fill("what is the cat's name")
    panel.get_by_role("button", name="Search").click()
    expect(results.get_by_test_id("passage").first).to_contain_text("Pixel")
    expect(results).to_contain_text("nearest to “what is the cat's name”")
    results.scroll_into_view_if_needed()
    screenshot(page, "memory-archival-search")

    panel.get_by_placeholder("Search by meaning…").fill("")
    panel.get_by_test_id("archival-tag").select_option("work")
    expect(results.get_by_test_id("passage")).to_have_count(1)
    expect(results).to_contain_text("The report is due in March")

    page.once("dialog", lambda dialog: dialog.accept())
    results.get_by_test_id("passage-delete").click()
    expect(results).to_contain_text("Passage deleted.")
    expect(results.get_by_test_id("passage")).to_have_count(0)
