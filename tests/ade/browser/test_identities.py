"""Identities in a real browser: one is created from the list, given typed properties, linked to an agent
and found again by the list's name filter."""

from __future__ import annotations

from playwright.sync_api import expect

from apps.agents.services import agent_create
from apps.identities.models import Identity
from tests.ade.browser.conftest import Ade


def test_create_an_identity_give_it_properties_and_link_an_agent(ade: Ade, screenshot) -> None:
    agent = agent_create(actor=ade.actor, name="Concierge", model="openai/gpt-4o-mini")
    page = ade.page
    page.goto(ade.url("/identities/"))
    expect(page.locator("nav.mainnav a.active")).to_have_text("Identities")
    expect(page.get_by_test_id("no-identities")).to_be_visible()

    page.get_by_test_id("new-identity").click()
    page.get_by_test_id("identity-key").fill("user-42")
    page.get_by_test_id("identity-name").fill("Sam Lee")
    page.get_by_test_id("create-identity").click()
    expect(page.get_by_test_id("identity-title")).to_have_text("Sam Lee")

    for key, kind, value in (("plan", "string", "pro"), ("seats", "number", "5")):
        page.get_by_test_id("property-key").fill(key)
        page.get_by_test_id("property-type").select_option(kind)
        page.get_by_test_id("property-value-input").fill(value)
        page.get_by_test_id("save-property").click()
        expect(page.locator(f'[data-testid=property-row][data-property-key="{key}"]')).to_be_visible()
    page.get_by_test_id("link-agent-select").select_option(agent.id)
    page.get_by_test_id("link-agent").click()
    expect(page.get_by_test_id("identity-agent")).to_have_text("Concierge Unlink")
    screenshot(page, "identity-detail")

    page.goto(ade.url("/identities/?q=sam"))
    expect(page.get_by_test_id("identity-row")).to_have_count(1)
    expect(page.get_by_test_id("identity-agent-count")).to_have_text("1")
    identity = Identity.objects.for_actor(ade.actor).get(identifier_key="user-42")
    assert identity.properties == [
        {"key": "plan", "value": "pro", "type": "string"},
        {"key": "seats", "value": 5, "type": "number"},
    ]
