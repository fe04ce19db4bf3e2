"""Archives in a real browser: a shared archive is created from the list, a passage is added and deleted
in place (HTMX), and the search box finds passages as an agent's archival_memory_search would."""

from __future__ import annotations

from playwright.sync_api import expect

from apps.memory.models import Archive, Passage
from tests.ade.browser.conftest import Ade


def test_create_an_archive_add_search_and_delete_passages(ade: Ade, screenshot) -> None:
    page = ade.page
    page.goto(ade.url("/archives/"))
    expect(page.locator("nav.mainnav a.active")).to_have_text("Archives")
    expect(page.get_by_test_id("no-archives")).to_be_visible()

    page.get_by_test_id("new-archive").click()
    page.get_by_test_id("archive-name").fill("field notes")
    page.get_by_test_id("archive-description").fill("What we saw outside")
    page.locator("select[name=embedding]").select_option("")  # no model: text match
    page.get_by_test_id("create-archive").click()

    expect(page.get_by_test_id("archive-title")).to_have_text("field notes")
    expect(page.get_by_test_id("no-passages")).to_be_visible()
    for text, tags in (("The heron nests by the north pond.", "birds"), ("Bring boots in March.", "")):
        page.get_by_test_id("passage-text").fill(text)
        page.get_by_test_id("passage-tags").fill(tags)
        page.get_by_test_id("add-passage").click()
        expect(page.get_by_test_id("passages-notice")).to_have_text("Passage added.")
    expect(page.get_by_test_id("passage-row")).to_have_count(2)
    expect(page.get_by_test_id("passage-row").first).to_contain_text("Bring boots in March.")  # newest first
    expect(page.get_by_test_id("passage-text")).to_have_value("")  # the form is fresh again

    page.get_by_test_id("archive-search-input").fill("heron pond")
    page.get_by_test_id("archive-search-input").press("Enter")
    expect(page.get_by_test_id("archive-hit")).to_have_count(1)
    expect(page.get_by_test_id("archive-hit")).to_contain_text("The heron nests by the north pond.")
    screenshot(page, "archive-search")

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("passage-row").first.get_by_test_id("delete-passage").click()
    expect(page.get_by_test_id("passages-notice")).to_have_text("Passage deleted.")
    expect(page.get_by_test_id("passage-row")).to_have_count(1)

    archive = Archive.objects.for_actor(ade.actor).get(name="field notes")
    assert archive.description == "What we saw outside"
    assert list(Passage.objects.for_actor(ade.actor).values_list("text", "tags")) == [
        ("The heron nests by the north pond.", ["birds"])
    ]
