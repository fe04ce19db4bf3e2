"""The workspace fills the window at laptop and wide-screen sizes: each column scrolls on its own and
the page itself never does, so the send box and the memory panel stay in view."""

from __future__ import annotations

import pytest

from apps.agents.services import BlockSpec, agent_create
from tests.ade.browser.conftest import Ade


@pytest.mark.parametrize(("width", "height"), [(1280, 800), (1920, 1080)])
def test_the_workspace_fits_the_window_and_its_columns_scroll(
    ade: Ade, screenshot, width: int, height: int
) -> None:
    agent = agent_create(
        actor=ade.actor,
        name="Roomy",
        model="openai/gpt-4o-mini",
        system="You are helpful.\n" * 80,  # a long system prompt: the configuration column overflows
        memory_blocks=[BlockSpec(label="human", value="Name: Ada", limit=2000)],
    )
    page = ade.page
    page.set_viewport_size({"width": width, "height": height})
    page.goto(ade.url(f"/agents/{agent.id}/"))

    assert page.evaluate("document.documentElement.scrollHeight") <= height
    config = page.locator("#config-column")
    assert config.evaluate("el => el.scrollHeight > el.clientHeight")  # it scrolls by itself
    for column in ("#config-column", "#conversation-column", "#memory-column"):
        box = page.locator(column).bounding_box()
        assert box is not None
        assert box["x"] >= 0
        assert box["x"] + box["width"] <= width
    composer = page.get_by_test_id("composer-text").bounding_box()
    assert composer is not None
    assert composer["y"] + composer["height"] <= height
    screenshot(page, f"workspace-{width}")
