"""Run pages in a real browser: from the workspace to an agent's runs, a run's steps with the exact LLM
request and response, and thumbs up/down feedback on a step (HTMX, no reload)."""

from __future__ import annotations

from playwright.sync_api import expect

from apps.agents.models import Step
from apps.agents.services import BlockSpec, MessageIn, agent_create, agent_send_message
from tests.ade.browser.conftest import Ade
from tests.support.scripted_llm import text, tool_call, tool_calls


def test_run_page_shows_steps_with_llm_request_and_response_and_takes_feedback(
    ade: Ade, llm, screenshot
) -> None:
    agent = agent_create(
        actor=ade.actor,
        name="Librarian",
        model="openai/gpt-4o-mini",
        memory_blocks=[BlockSpec(label="human", value="", limit=2000)],
    )
    llm.push(
        tool_calls(
            tool_call("memory_insert", {"label": "human", "new_string": "Reads sci-fi"}),
            reasoning="Worth remembering.",
        ),
        text("I'll remember that you read sci-fi."),
    )
    run = agent_send_message(
        actor=ade.actor, agent_id=agent.id, messages=[MessageIn(content="I mostly read sci-fi")]
    ).run
    page = ade.page

    page.goto(ade.url(f"/agents/{agent.id}/"))
    page.get_by_test_id("runs-link").click()
    expect(page.get_by_test_id("runs-table")).to_contain_text("Turn ended")
    page.locator(f"a[href='/runs/{run.id}/']").click()

    expect(page.get_by_test_id("run-status")).to_have_text("completed")
    steps = page.get_by_test_id("step")
    expect(steps).to_have_count(2)
    first = steps.first
    expect(first).to_contain_text("gpt-4o-mini")
    expect(first.locator(".ev-tool-call")).to_contain_text("Reads sci-fi")
    first.get_by_test_id("step-request").locator("summary").click()
    expect(first.get_by_test_id("step-request").locator("pre")).to_contain_text(
        '"content": "I mostly read sci-fi"'
    )
    first.get_by_test_id("step-response").locator("summary").click()
    expect(first.get_by_test_id("step-response").locator("pre")).to_be_visible()
    expect(steps.last).to_contain_text("I'll remember that you read sci-fi.")

    first.get_by_test_id("thumb-up").click()
    expect(first.get_by_test_id("thumb-up")).to_have_attribute("aria-pressed", "true")
    step = Step.all_objects.filter(run=run).order_by("created_at").first()
    step.refresh_from_db()
    assert step.feedback == "positive"
    screenshot(page, "run-page")

    first.get_by_test_id("thumb-down").click()
    expect(first.get_by_test_id("thumb-down")).to_have_attribute("aria-pressed", "true")
    expect(first.get_by_test_id("thumb-up")).to_have_attribute("aria-pressed", "false")
    step.refresh_from_db()
    assert step.feedback == "negative"
