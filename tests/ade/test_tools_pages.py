"""The ADE's tool pages: list and search, the editor with its live schema, save/delete, test runs."""

from __future__ import annotations

import json

import pytest

from apps.core.actor import Role
from apps.tools.models import Tool
from apps.tools.services import tool_upsert, tool_upsert_builtins
from tests.factories import ToolFactory

HTMX = {"HTTP_HX_REQUEST": "true"}

ADD = '''def add(a: int, b: int = 2) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    print("adding", a, b)
    return a + b
'''

ADD_UNDOCUMENTED_B = ADD.replace("        b: The second number.\n", "")

FAILING = '''def explode(reason: str) -> str:
    """Always fails.

    Args:
        reason: Why.
    """
    raise RuntimeError(f"boom: {reason}")
'''


@pytest.fixture
def local_sandbox(settings):
    """Runs go to the local jail (fast, no engine needed; Docker has its own tests)."""
    settings.SANDBOX_BACKEND = "local"
    return settings


def custom_tool(actor, source: str = ADD, **fields) -> Tool:
    return tool_upsert(actor=actor, source_code=source, **fields)


# --- list --------------------------------------------------------------------------------------------------


def test_the_list_shows_custom_and_built_in_tools_with_their_type_and_tags(owner_client, actor):
    custom_tool(actor, tags=["maths"])
    ToolFactory(organization_id=actor.organization_id, name="mcp_weather", tool_type=Tool.Type.EXTERNAL_MCP)

    body = owner_client.get("/tools/").content.decode()

    assert 'data-tool="add"' in body
    assert '<span class="tag">maths</span>' in body
    assert '<span class="kind kind-custom">custom</span>' in body
    assert 'data-tool="send_message"' in body  # the built-ins, as /v1/tools lists them
    assert '<span class="kind kind-builtin">built-in</span>' in body
    assert '<span class="kind kind-mcp">MCP</span>' in body
    assert "Add two numbers." in body


def test_searching_by_name_answers_with_the_matching_rows_only(owner_client, actor):
    custom_tool(actor)

    response = owner_client.get("/tools/?q=ADD", HTTP_HX_TARGET="tool-rows", **HTMX)

    body = response.content.decode()
    assert response.status_code == 200
    assert "<table" not in body  # just the rows
    assert 'data-tool="add"' in body
    assert 'data-tool="send_message"' not in body


def test_filtering_by_type(owner_client, actor):
    custom_tool(actor)

    builtins = owner_client.get("/tools/?type=builtin").content.decode()
    customs = owner_client.get("/tools/?type=custom").content.decode()

    assert 'data-tool="send_message"' in builtins
    assert 'data-tool="add"' not in builtins
    assert 'data-tool="add"' in customs
    assert 'data-tool="send_message"' not in customs


def test_a_search_without_results_says_so(owner_client):
    body = owner_client.get("/tools/?q=zzz", HTTP_HX_TARGET="tool-rows", **HTMX).content.decode()

    assert "No tools match “zzz”." in body


def test_another_organisations_tools_are_not_listed(owner_client, other_org_actor):
    custom_tool(other_org_actor)

    body = owner_client.get("/tools/").content.decode()

    assert 'data-tool="add"' not in body


# --- editor and live schema -----------------------------------------------------------------------------


def test_the_new_tool_page_has_the_ace_editor_a_starter_function_and_its_schema(owner_client):
    body = owner_client.get("/tools/new/").content.decode()

    assert "django_ace/ace/ace.js" in body
    assert 'name="source_code"' in body
    assert "def roll_dice(sides: int = 6, count: int = 1)" in body
    assert "&quot;sides&quot;: {" in body or '"sides": {' in body
    assert 'hx-trigger="keyup changed delay:400ms, input changed delay:400ms"' in body


def test_the_schema_preview_shows_the_generated_schema(owner_client):
    response = owner_client.post("/tools/schema/", {"source_code": ADD}, **HTMX)

    body = response.content.decode()
    assert response.status_code == 200
    assert "&quot;name&quot;: &quot;add&quot;" in body
    assert "&quot;description&quot;: &quot;The second number.&quot;" in body
    sample = body.split('data-sample-args="', 1)[1].split('"', 1)[0].replace("&quot;", '"')
    assert json.loads(sample) == {"a": 0, "b": 0}


def test_the_schema_preview_explains_an_incomplete_docstring(owner_client):
    response = owner_client.post("/tools/schema/", {"source_code": ADD_UNDOCUMENTED_B}, **HTMX)

    body = response.content.decode()
    assert response.status_code == 422
    assert 'data-testid="schema-error"' in body
    assert (
        "parameter &#x27;b&#x27; of tool &#x27;add&#x27; is not described in the docstring&#x27;s Args section"
        in body
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(:\n", "tool source does not parse: line 1"),
        ("x = 1\n", "tool source defines no top-level function"),
        ("def f(a: int):\n    return a\n", "has no docstring"),
        ("", "Write a Python function"),
    ],
)
def test_the_schema_preview_explains_other_mistakes(owner_client, source, message):
    response = owner_client.post("/tools/schema/", {"source_code": source}, **HTMX)

    assert response.status_code == 422
    assert message in response.content.decode()


def test_an_existing_tool_opens_with_its_source_schema_and_sample_arguments(owner_client, actor):
    tool = custom_tool(actor, tags=["maths", "demo"])

    body = owner_client.get(f"/tools/{tool.id}/").content.decode()

    assert "def add(a: int, b: int = 2) -&gt; int:" in body
    assert 'value="maths, demo"' in body
    assert 'data-testid="schema-json"' in body
    assert "&quot;a&quot;: 0," in body  # the run arguments' starting point
    assert 'data-testid="delete-tool"' in body


# --- save ---------------------------------------------------------------------------------------------------


def test_creating_a_tool_goes_to_its_page(owner_client, actor):
    response = owner_client.post(
        "/tools/new/", {"source_code": ADD, "tags": "maths, demo, maths", "return_char_limit": "500"}, **HTMX
    )

    tool = Tool.objects.for_actor(actor).get(name="add")
    assert response.status_code == 204
    assert response["HX-Redirect"] == f"/tools/{tool.id}/"
    assert tool.tags == ["maths", "demo"]
    assert tool.return_char_limit == 500
    assert tool.json_schema["parameters"]["required"] == ["a"]
    assert tool.created_by_id == actor.user_id
    assert "Tool &#x27;add&#x27; created." in owner_client.get(response["HX-Redirect"]).content.decode()


def test_creating_a_tool_with_an_incomplete_docstring_is_refused_with_the_reason(owner_client, actor):
    response = owner_client.post("/tools/new/", {"source_code": ADD_UNDOCUMENTED_B}, **HTMX)

    assert response.status_code == 422
    assert "parameter &#x27;b&#x27; of tool &#x27;add&#x27; is not described" in response.content.decode()
    assert not Tool.objects.for_actor(actor).filter(name="add").exists()


def test_a_new_tool_never_overwrites_one_of_the_same_name(owner_client, actor):
    existing = custom_tool(actor, tags=["keep"])

    response = owner_client.post("/tools/new/", {"source_code": ADD.replace("a + b", "a - b")}, **HTMX)

    assert response.status_code == 422
    assert "A tool named &#x27;add&#x27; already exists" in response.content.decode()
    existing.refresh_from_db()
    assert "a + b" in existing.source_code


def test_a_built_in_name_is_refused(owner_client, actor):
    source = ADD.replace("def add(", "def send_message(")

    response = owner_client.post("/tools/new/", {"source_code": source}, **HTMX)

    assert response.status_code == 422
    assert "is a built-in Letta tool" in response.content.decode()


def test_saving_changes_updates_the_tool_and_its_title(owner_client, actor):
    tool = custom_tool(actor)
    renamed = ADD.replace("def add(", "def add_numbers(")

    response = owner_client.post(
        f"/tools/{tool.id}/", {"source_code": renamed, "tags": "x", "return_char_limit": "1000"}, **HTMX
    )

    body = response.content.decode()
    assert response.status_code == 200
    assert "Saved “add_numbers”" in body
    assert 'id="tool-title" data-testid="tool-title" hx-swap-oob="true"' in body
    tool.refresh_from_db()
    assert tool.name == "add_numbers"
    assert tool.tags == ["x"]
    assert tool.json_schema["name"] == "add_numbers"


def test_saving_a_bad_limit_says_so(owner_client, actor):
    tool = custom_tool(actor)

    response = owner_client.post(
        f"/tools/{tool.id}/", {"source_code": ADD, "return_char_limit": "lots"}, **HTMX
    )

    assert response.status_code == 422
    assert "must be a whole number" in response.content.decode()


def test_renaming_onto_another_tool_is_refused(owner_client, actor):
    custom_tool(actor, ADD.replace("def add(", "def other("))
    tool = custom_tool(actor)

    response = owner_client.post(
        f"/tools/{tool.id}/", {"source_code": ADD.replace("def add(", "def other(")}, **HTMX
    )

    assert response.status_code == 422
    assert "Tool with name &#x27;other&#x27; already exists" in response.content.decode()


def test_without_javascript_saving_redirects_back_to_the_editor(owner_client, actor):
    tool = custom_tool(actor)

    response = owner_client.post(f"/tools/{tool.id}/", {"source_code": ADD, "tags": "plain"}, follow=True)

    assert response.redirect_chain == [(f"/tools/{tool.id}/", 302)]
    assert "Tool &#x27;add&#x27; saved." in response.content.decode()


def test_built_in_tools_are_read_only(owner_client, actor):
    tool = tool_upsert_builtins(actor=actor, names=["send_message"])["send_message"]

    page = owner_client.get(f"/tools/{tool.id}/").content.decode()
    saved = owner_client.post(f"/tools/{tool.id}/", {"source_code": ADD}, **HTMX)
    deleted = owner_client.post(f"/tools/{tool.id}/delete/", **HTMX)

    assert "A built-in Letta tool" in page
    assert 'id="tool-form"' not in page
    assert 'data-testid="schema-json"' in page
    assert saved.status_code == 422
    assert "built-in tools cannot be created, modified or deleted" in saved.content.decode()
    assert deleted.status_code == 422
    assert Tool.objects.for_actor(actor).filter(id=tool.id).exists()


def test_deleting_a_tool(owner_client, actor):
    tool = custom_tool(actor)

    response = owner_client.post(f"/tools/{tool.id}/delete/", **HTMX)

    assert response.status_code == 204
    assert response["HX-Redirect"] == "/tools/"
    assert not Tool.objects.for_actor(actor).filter(id=tool.id).exists()
    assert "Tool &#x27;add&#x27; deleted." in owner_client.get("/tools/").content.decode()


def test_members_may_create_and_edit_tools_as_the_api_allows(client, org, actor, make_user):
    client.force_login(make_user(org, role=Role.MEMBER))

    created = client.post("/tools/new/", {"source_code": ADD}, **HTMX)
    tool = Tool.objects.for_actor(actor).get(name="add")
    page = client.get(f"/tools/{tool.id}/").content.decode()

    assert created.status_code == 204
    assert "Only owners and admins can run tool code by hand" in page
    assert 'data-testid="run-tool"' not in page


def test_another_organisations_tool_is_not_found(owner_client, other_org_actor):
    theirs = custom_tool(other_org_actor)

    assert owner_client.get(f"/tools/{theirs.id}/").status_code == 404
    assert owner_client.post(f"/tools/{theirs.id}/", {"source_code": ADD}, **HTMX).status_code == 404
    assert owner_client.post(f"/tools/{theirs.id}/delete/", **HTMX).status_code == 404
    assert Tool.objects.for_actor(other_org_actor).filter(id=theirs.id).exists()


# --- test runs ------------------------------------------------------------------------------------------------


def test_running_shows_the_result_stdout_sandbox_and_duration(owner_client, local_sandbox):
    response = owner_client.post("/tools/run/", {"source_code": ADD, "args": '{"a": 40, "b": 2}'}, **HTMX)

    body = response.content.decode()
    assert response.status_code == 200
    assert '<span class="badge ok" data-testid="run-status">success</span>' in body
    assert '<pre data-testid="run-return">42</pre>' in body
    assert '<pre data-testid="run-stdout">adding 40 2</pre>' in body
    assert "sandbox: local (jail)" in body
    assert " ms</span>" in body


def test_a_tool_exception_is_shown_as_an_error(owner_client, local_sandbox):
    response = owner_client.post("/tools/run/", {"source_code": FAILING, "args": '{"reason": "x"}'}, **HTMX)

    body = response.content.decode()
    assert response.status_code == 200
    assert '<span class="badge err" data-testid="run-status">error</span>' in body
    assert "boom: x" in body


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            '{"a": 1,}',
            "The arguments are not valid JSON: Expecting property name enclosed in double quotes (line 1, column 9).",
        ),
        ("[1, 2]", "The arguments must be a JSON object"),
    ],
)
def test_bad_arguments_are_explained(owner_client, local_sandbox, args, message):
    response = owner_client.post("/tools/run/", {"source_code": ADD, "args": args}, **HTMX)

    assert response.status_code == 422
    assert message.replace('"', "&quot;") in response.content.decode()


def test_a_run_where_no_sandbox_is_allowed_says_why(owner_client, org, local_sandbox):
    org.allow_local_sandbox = False
    org.save()

    response = owner_client.post("/tools/run/", {"source_code": ADD, "args": '{"a": 1}'}, **HTMX)

    assert response.status_code == 422
    assert "does not allow the local sandbox" in response.content.decode()


def test_members_cannot_run_tool_code(client, org, make_user, local_sandbox):
    client.force_login(make_user(org, role=Role.MEMBER))

    response = client.post("/tools/run/", {"source_code": ADD, "args": '{"a": 1}'}, **HTMX)

    assert response.status_code == 403
    assert "only owners and admins may run arbitrary tool code" in response.content.decode()
