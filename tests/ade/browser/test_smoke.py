from __future__ import annotations

from tests.ade.browser.conftest import Ade


def test_signing_in_lands_on_the_agent_list_of_the_users_organisation(ade: Ade, screenshot) -> None:
    page = ade.page
    assert page.url.endswith("/agents/")
    assert page.locator("[data-testid=org-switch] option:checked").inner_text().startswith(ade.org.name)
    screenshot(page, "agents-empty")
