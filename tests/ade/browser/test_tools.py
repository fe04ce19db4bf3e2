"""The tool editor in a real browser: Ace, the schema generated live from the docstring (and its
error while the docstring is incomplete), saving, and a test run in the sandbox."""

from __future__ import annotations

import json

from playwright.sync_api import expect

from apps.tools.models import Tool
from apps.tools.services import tool_upsert
from tests.ade.browser.conftest import Ade

INCOMPLETE = '''def add(a: int, b: int = 2) -> int:
    """Add two numbers.

    Args:
        a: The first number.
    """
    print("adding", a, b)
    return a + b
'''


def test_write_a_tool_see_its_schema_live_save_and_run_it(ade: Ade, screenshot) -> None:
    page = ade.page
    page.goto(ade.url("/tools/new/"))
    editor = page.locator("#source-editor.ace_editor")
    expect(editor).to_be_visible()  # Ace took over the textarea
    expect(page.get_by_test_id("schema-json")).to_contain_text('"name": "roll_dice"')  # the starter

    # Paste a function whose docstring misses a parameter: the schema turns into the reason.
    page.evaluate("src => document.getElementById('source-editor').aceEditor.setValue(src, 1)", INCOMPLETE)
    expect(page.get_by_test_id("schema-error")).to_contain_text(
        "parameter 'b' of tool 'add' is not described in the docstring's Args section"
    )
    screenshot(page, "tool-editor-schema-error")

    # Describe it, typing into Ace: the schema comes back, and the run arguments follow it.
    page.evaluate("""() => {
        const ed = document.getElementById('source-editor').aceEditor;
        ed.focus();
        ed.gotoLine(5, ed.session.getLine(4).length, false);
    }""")
    page.keyboard.press("Enter")
    page.keyboard.type("b: The second number.")
    schema = page.get_by_test_id("schema-json")
    expect(schema).to_contain_text('"description": "The second number."')
    assert json.loads(schema.inner_text())["parameters"]["required"] == ["a"]
    expect(page.get_by_test_id("run-args")).to_have_value(json.dumps({"a": 0, "b": 0}, indent=2))
    assert "b: The second number." in page.locator("#source_code").input_value()  # the posted field

    page.get_by_label("Tags").fill("maths")
    page.get_by_test_id("save-tool").click()
    page.wait_for_url("**/tools/tool-*/")
    tool = Tool.objects.for_actor(ade.actor).get(name="add")
    assert tool.tags == ["maths"]
    assert tool.json_schema["parameters"]["properties"]["b"]["description"] == "The second number."
    expect(page.get_by_test_id("tool-title")).to_have_text("add")

    page.get_by_test_id("run-args").fill('{"a": 40, "b": 2}')
    page.get_by_test_id("run-tool").click()
    expect(page.get_by_test_id("run-return")).to_have_text("42")
    expect(page.get_by_test_id("run-status")).to_have_text("success")
    expect(page.get_by_test_id("run-stdout")).to_have_text("adding 40 2")
    expect(page.get_by_test_id("run-sandbox")).to_contain_text("sandbox: ")
    expect(page.get_by_test_id("run-duration")).to_contain_text(" ms")
    screenshot(page, "tool-editor")
    page.set_viewport_size({"width": 1280, "height": 800})
    source, side = page.locator(".tool-source").bounding_box(), page.locator(".tool-side").bounding_box()
    assert source is not None
    assert side is not None
    assert side["x"] >= source["x"] + source["width"]  # still side by side: schema and run beside the code
    screenshot(page, "tool-editor-1280")
    page.set_viewport_size({"width": 1920, "height": 1080})
    screenshot(page, "tool-editor-1920")

    page.get_by_test_id("run-args").fill('{"a": 40,')
    page.get_by_test_id("run-tool").click()
    expect(page.get_by_test_id("run-error")).to_contain_text("The arguments are not valid JSON")


def test_saving_changes_keeps_the_page_and_renames_the_tool(ade: Ade) -> None:
    tool = tool_upsert(
        actor=ade.actor,
        source_code=INCOMPLETE.replace(
            "        a: The first number.\n", "        a: The first number.\n        b: The second.\n"
        ),
    )
    page = ade.page
    page.goto(ade.url(f"/tools/{tool.id}/"))
    expect(page.locator("#source-editor.ace_editor")).to_be_visible()

    page.evaluate("""() => {
        const ed = document.getElementById('source-editor').aceEditor;
        ed.setValue(ed.getValue().replace('def add(', 'def add_numbers('), 1);
    }""")
    expect(page.get_by_test_id("schema-json")).to_contain_text('"name": "add_numbers"')
    page.get_by_test_id("save-tool").click()

    expect(page.get_by_test_id("save-ok")).to_contain_text("Saved “add_numbers”")
    expect(page.get_by_test_id("tool-title")).to_have_text("add_numbers")
    assert page.url.endswith(f"/tools/{tool.id}/")
    tool.refresh_from_db()
    assert tool.name == "add_numbers"


def test_the_tool_list_searches_by_name(ade: Ade, screenshot) -> None:
    tool_upsert(
        actor=ade.actor,
        source_code=INCOMPLETE.replace(
            "        a: The first number.\n", "        a: The first number.\n        b: The second.\n"
        ),
        tags=["maths"],
    )
    page = ade.page
    page.goto(ade.url("/tools/"))
    expect(page.locator("tr[data-tool=add]")).to_be_visible()
    expect(page.locator("tr[data-tool=send_message]")).to_be_visible()
    screenshot(page, "tools-list")

    page.get_by_test_id("tool-search").fill("ad")
    expect(page.locator("tr[data-tool=send_message]")).to_have_count(0)
    expect(page.locator("tr[data-tool=add]")).to_contain_text("maths")
    assert "q=ad" in page.url

    page.locator("tr[data-tool=add] a").click()
    page.wait_for_url(f"**/tools/{Tool.objects.for_actor(ade.actor).get(name='add').id}/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("delete-tool").click()
    page.wait_for_url("**/tools/")
    expect(page.locator("#flash")).to_contain_text("Tool 'add' deleted.")
    assert not Tool.objects.for_actor(ade.actor).filter(name="add").exists()


def test_without_ace_the_textarea_is_the_editor_and_the_schema_still_follows(ade: Ade) -> None:
    page = ade.page
    page.route("**/django_ace/ace/ace.js", lambda route: route.abort())
    page.goto(ade.url("/tools/new/"))
    textarea = page.locator("#source_code")
    expect(textarea).to_be_visible()
    expect(page.locator("#source-editor")).to_be_hidden()

    textarea.fill(INCOMPLETE)
    expect(page.get_by_test_id("schema-error")).to_contain_text(
        "parameter 'b' of tool 'add' is not described"
    )
    textarea.fill(
        INCOMPLETE.replace("a: The first number.\n", "a: The first number.\n        b: The second.\n")
    )
    expect(page.get_by_test_id("schema-json")).to_contain_text('"description": "The second."')

    page.get_by_test_id("save-tool").click()
    page.wait_for_url("**/tools/tool-*/")
    assert Tool.objects.for_actor(ade.actor).filter(name="add").exists()
