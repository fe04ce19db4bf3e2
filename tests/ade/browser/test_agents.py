"""The agent list and create page in a real browser: templates, search, export/import, delete."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import expect

from apps.agents.models import Agent
from apps.agents.services import BlockSpec, agent_create
from tests.ade.browser.conftest import Ade


def test_create_an_agent_from_a_template_and_land_in_its_workspace(ade: Ade, screenshot) -> None:
    page = ade.page
    page.goto(ade.url("/agents/"))
    page.get_by_test_id("new-agent").click()
    page.wait_for_url("**/agents/new/")
    expect(page.get_by_test_id("model-picker").locator("select")).to_have_value("openai/scripted-chat")
    page.get_by_test_id("template-sleeptime").click()
    page.get_by_test_id("agent-name").fill("Trip planner")
    screenshot(page, "agents-create")

    page.get_by_test_id("create-agent").click()

    page.wait_for_url(re.compile(r"/agents/agent-[^/]+/$"))
    expect(page.get_by_test_id("cfg-name").locator("input[name=value]")).to_have_value("Trip planner")
    agent = Agent.objects.for_actor(ade.actor).get(name="Trip planner")
    assert page.url.endswith(f"/agents/{agent.id}/")
    assert sorted(agent.blocks.values_list("label", flat=True)) == ["human", "persona"]
    assert agent.enable_sleeptime is True


def test_create_form_shows_what_is_wrong_without_leaving_the_page(ade: Ade) -> None:
    page = ade.page
    page.goto(ade.url("/agents/new/"))
    page.get_by_test_id("agent-name").fill("no/slashes")

    page.get_by_test_id("create-agent").click()

    expect(page.get_by_role("alert")).to_contain_text("Invalid agent name")
    assert page.url.endswith("/agents/new/")
    assert not Agent.objects.for_actor(ade.actor).exists()


def test_search_filter_export_import_and_delete(ade: Ade, screenshot, tmp_path: Path) -> None:
    for name, tags in (("Support bot", ["support"]), ("Travel planner", ["travel"]), ("Research helper", [])):
        agent_create(
            actor=ade.actor,
            name=name,
            model="openai/scripted-chat",
            tags=tags,
            memory_blocks=[BlockSpec(label="persona", value=f"I am {name}.")],
        )
    page = ade.page
    page.goto(ade.url("/agents/"))
    rows = page.get_by_test_id("agent-row")
    expect(rows).to_have_count(3)
    screenshot(page, "agents-list")

    page.get_by_test_id("agent-search").fill("travel")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-agent-name", "Travel planner")
    page.get_by_test_id("agent-search").fill("")
    expect(rows).to_have_count(3)
    page.get_by_test_id("tag-filter-support").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-agent-name", "Support bot")

    with page.expect_download() as download_info:
        rows.first.get_by_test_id("export-agent").click()
    download = download_info.value
    assert download.suggested_filename == "Support-bot.af"
    saved = tmp_path / download.suggested_filename
    download.save_as(saved)

    page.goto(ade.url("/agents/"))
    page.get_by_test_id("import-file").set_input_files(str(saved))
    page.get_by_test_id("import-form").get_by_role("button", name="Import").click()
    expect(page.get_by_test_id("import-success")).to_contain_text("Support bot_copy")
    expect(page.locator("[data-agent-name='Support bot_copy']")).to_be_visible()
    imported = Agent.objects.for_actor(ade.actor).get(name="Support bot_copy")
    assert imported.blocks.get(label="persona").value == "I am Support bot."

    doomed = page.locator("[data-agent-name='Research helper']")
    doomed.get_by_test_id("delete-agent").click()
    expect(page.get_by_test_id("delete-confirm")).to_contain_text("Delete Research helper?")
    page.get_by_test_id("confirm-delete").click()
    expect(page.get_by_test_id("delete-confirm")).to_have_count(0)
    expect(page.locator("[data-agent-name='Research helper']")).to_have_count(0)
    expect(page.locator("#flash")).to_contain_text("Deleted “Research helper”.")
    assert not Agent.objects.for_actor(ade.actor).filter(name="Research helper").exists()


def test_a_bad_agent_file_gets_a_clear_error(ade: Ade, tmp_path: Path) -> None:
    bad = tmp_path / "broken.af"
    bad.write_text("{not json")
    page = ade.page
    page.goto(ade.url("/agents/"))

    page.get_by_test_id("import-file").set_input_files(str(bad))
    page.get_by_test_id("import-form").get_by_role("button", name="Import").click()

    expect(page.get_by_test_id("import-error")).to_have_text("Corrupted agent file format.")
