"""The workspace's configuration column in a real browser: fields save in place, tool rules."""

from __future__ import annotations

from playwright.sync_api import expect

from apps.agents.models import Agent
from apps.agents.services import BlockSpec, agent_create
from tests.ade.browser.conftest import Ade, sign_in


def test_change_model_and_system_prompt_without_a_reload_then_add_a_tool_rule(ade: Ade, screenshot) -> None:
    agent = agent_create(
        actor=ade.actor,
        name="Configured",
        model="openai/scripted-chat",
        memory_blocks=[BlockSpec(label="human", value="Name: Ada")],
    )
    page = ade.page
    page.goto(ade.url(f"/agents/{agent.id}/"))
    page.evaluate("window.__sameDocument = true")
    page.evaluate(
        "() => { window.__changes = 0;"
        " document.body.addEventListener('ade:agent-changed', () => window.__changes++); }"
    )

    model = page.get_by_test_id("cfg-model")
    expect(model.locator("select")).to_have_value("openai/scripted-chat")
    model.get_by_test_id("model-other").fill("openai/gpt-4o-mini")
    model.get_by_test_id("model-other").press("Enter")
    expect(page.get_by_test_id("cfg-model").get_by_test_id("saved")).to_be_visible()
    expect(page.get_by_test_id("cfg-model").locator("select")).to_have_value("openai/gpt-4o-mini")

    system = page.get_by_test_id("cfg-system")
    system.locator("textarea").fill("You are a terse assistant.")
    expect(system.get_by_test_id("char-count")).to_have_text("26 characters")
    system.get_by_test_id("save-system").click()
    expect(page.get_by_test_id("cfg-system").get_by_test_id("saved")).to_be_visible()

    page.get_by_test_id("add-rule-type").select_option("max_count_per_step")
    form = page.get_by_test_id("rule-form")
    form.get_by_test_id("rule-tool-name").fill("conversation_search")
    form.get_by_test_id("rule-max-count").fill("0")
    form.get_by_test_id("save-rule").click()
    expect(page.get_by_test_id("rule-error")).to_contain_text("must be at least 1")
    page.get_by_test_id("rule-max-count").fill("2")
    page.get_by_test_id("save-rule").click()
    expect(page.get_by_test_id("rule-item")).to_contain_text(
        "You may call conversation_search at most 2 time(s)"
    )

    assert page.evaluate("window.__sameDocument") is True
    assert page.evaluate("window.__changes") == 3
    stored = Agent.objects.for_actor(ade.actor).get(id=agent.id)
    assert stored.model == "openai/gpt-4o-mini"
    assert stored.system == "You are a terse assistant."
    assert stored.tool_rules == [
        {"type": "max_count_per_step", "tool_name": "conversation_search", "max_count_limit": 2}
    ]
    page.locator("#config-column").evaluate("column => column.scrollTo(0, 0)")
    screenshot(page, "workspace-config")


def test_an_invalid_model_handle_is_explained_in_place(ade: Ade) -> None:
    agent = agent_create(actor=ade.actor, name="Configured", model="openai/scripted-chat")
    page = ade.page
    page.goto(ade.url(f"/agents/{agent.id}/"))

    other = page.get_by_test_id("cfg-model").get_by_test_id("model-other")
    other.fill("gpt-4o")
    other.press("Enter")

    expect(page.get_by_test_id("cfg-model").get_by_role("alert")).to_contain_text(
        "expected 'provider/model-name'"
    )
    assert Agent.objects.for_actor(ade.actor).get(id=agent.id).model == "openai/scripted-chat"


def test_config_column_at_1920_wide(ade: Ade, new_page, screenshot) -> None:
    agent = agent_create(
        actor=ade.actor,
        name="Wide",
        model="openai/scripted-chat",
        tool_rules=[{"type": "exit_loop", "tool_name": "memory_replace"}],
    )
    page = new_page(1920, 1080)
    sign_in(page, ade.server, ade.user.username)
    page.goto(ade.url(f"/agents/{agent.id}/"))

    expect(page.get_by_test_id("cfg-model").locator("select")).to_have_value("openai/scripted-chat")
    expect(page.get_by_test_id("rule-item")).to_contain_text("Calling memory_replace ends your response.")
    screenshot(page, "workspace-config-1920")
