"""JSON schema generation from tool source (pure: the source is parsed, never executed)."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from apps.core.errors import InvalidInput
from apps.tools.schema import (
    Docstring,
    ToolSchemaError,
    generate_schema,
    parse_google_docstring,
    validate_tool_name,
)

ROOT = Path(__file__).resolve().parents[2]


def schema_of(source: str, name: str | None = None) -> dict[str, object]:
    return generate_schema(textwrap.dedent(source), name=name)


def error_of(source: str, name: str | None = None) -> str:
    with pytest.raises(ToolSchemaError) as excinfo:
        generate_schema(textwrap.dedent(source), name=name)
    return str(excinfo.value)


def param_schema(annotation: str, default: str = "") -> dict[str, object]:
    """The property generated for a single parameter `x` with the given annotation."""
    source = f'''
    def f(x: {annotation}{default}):
        """Do it.

        Args:
            x: The x.
        """
    '''
    return schema_of(source)["parameters"]["properties"]["x"]  # type: ignore[index]


def test_full_schema_for_a_documented_function():
    source = '''
    def memory_insert(agent_state: "AgentState", label: str, new_string: str, insert_line: int = -1) -> None:
        """
        Insert text at a specific line in a memory block.

        Args:
            label (str): Section of the memory to be edited.
            new_string (str): The text to insert.
            insert_line (int): The line after which to insert (0 = beginning, -1 = end).

        Returns:
            None: Nothing.
        """
        return None
    '''

    schema = schema_of(source)

    assert schema == {
        "name": "memory_insert",
        "description": "Insert text at a specific line in a memory block.",
        "parameters": {
            "type": "object",
            "properties": {
                "label": {"type": "string", "description": "Section of the memory to be edited."},
                "new_string": {"type": "string", "description": "The text to insert."},
                "insert_line": {
                    "type": "integer",
                    "description": "The line after which to insert (0 = beginning, -1 = end).",
                },
            },
            "required": ["label", "new_string"],
        },
    }


def test_function_without_parameters_needs_no_args_section():
    source = '''
    def ping() -> str:
        """Check the tool runner is alive."""
    '''

    schema = schema_of(source)

    assert schema == {
        "name": "ping",
        "description": "Check the tool runner is alive.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    }


def test_description_keeps_every_paragraph_before_the_sections():
    source = '''
    def f(x: int):
        """Summary line.

        Longer explanation
        over two lines.

        Args:
            x: The x.

        Returns:
            str: Not part of the description.

        Raises:
            ValueError: Nor this.
        """
    '''

    schema = schema_of(source)

    assert schema["description"] == "Summary line.\n\nLonger explanation\nover two lines."


def test_multiline_parameter_description_keeps_its_lines():
    source = '''
    def f(x: int):
        """Do it.

        Args:
            x: First line
                second line.
        """
    '''

    schema = schema_of(source)

    assert schema["parameters"]["properties"]["x"]["description"] == "First line\nsecond line."


def test_str_maps_to_string():
    assert param_schema("str") == {"type": "string", "description": "The x."}


def test_int_maps_to_integer():
    assert param_schema("int") == {"type": "integer", "description": "The x."}


def test_float_maps_to_number():
    assert param_schema("float") == {"type": "number", "description": "The x."}


def test_bool_maps_to_boolean():
    assert param_schema("bool") == {"type": "boolean", "description": "The x."}


def test_typed_list_maps_to_array_of_items():
    assert param_schema("list[int]") == {
        "type": "array",
        "items": {"type": "integer"},
        "description": "The x.",
    }


def test_typing_list_maps_to_array_of_items():
    assert param_schema("List[str]") == {
        "type": "array",
        "items": {"type": "string"},
        "description": "The x.",
    }


def test_qualified_typing_list_maps_to_array_of_items():
    assert param_schema("typing.List[bool]") == {
        "type": "array",
        "items": {"type": "boolean"},
        "description": "The x.",
    }


def test_bare_list_means_a_list_of_strings():
    assert param_schema("list") == {"type": "array", "items": {"type": "string"}, "description": "The x."}


def test_nested_list_maps_to_nested_arrays():
    assert param_schema("list[list[float]]") == {
        "type": "array",
        "items": {"type": "array", "items": {"type": "number"}},
        "description": "The x.",
    }


def test_dict_maps_to_object():
    assert param_schema("dict") == {"type": "object", "description": "The x."}


def test_typed_dict_maps_to_object():
    assert param_schema("Dict[str, int]") == {"type": "object", "description": "The x."}


def test_string_literal_maps_to_string_enum():
    assert param_schema('Literal["any", "all"]') == {
        "type": "string",
        "enum": ["any", "all"],
        "description": "The x.",
    }


def test_integer_literal_maps_to_integer_enum():
    assert param_schema("typing.Literal[1, 2, -3]") == {
        "type": "integer",
        "enum": [1, 2, -3],
        "description": "The x.",
    }


def test_mixed_number_literal_maps_to_number_enum():
    assert param_schema("Literal[1, 2.5]") == {"type": "number", "enum": [1, 2.5], "description": "The x."}


def test_fixed_tuple_maps_to_prefix_items():
    assert param_schema("tuple[int, str]") == {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "minItems": 2,
        "maxItems": 2,
        "description": "The x.",
    }


def test_string_annotation_is_read_as_a_type():
    assert param_schema('"list[int]"') == {
        "type": "array",
        "items": {"type": "integer"},
        "description": "The x.",
    }


def test_annotated_uses_its_first_argument():
    assert param_schema('Annotated[int, "meta"]') == {"type": "integer", "description": "The x."}


def test_optional_is_not_required():
    source = '''
    from typing import Optional

    def f(a: Optional[str], b: str | None, c: Union[int, None], d: None | list[int], e: str):
        """Do it.

        Args:
            a: A.
            b: B.
            c: C.
            d: D.
            e: E.
        """
    '''

    schema = schema_of(source)

    assert schema["parameters"] == {
        "type": "object",
        "properties": {
            "a": {"type": "string", "description": "A."},
            "b": {"type": "string", "description": "B."},
            "c": {"type": "integer", "description": "C."},
            "d": {"type": "array", "items": {"type": "integer"}, "description": "D."},
            "e": {"type": "string", "description": "E."},
        },
        "required": ["e"],
    }


def test_defaults_make_parameters_optional():
    source = '''
    def f(a: int, b: int = 1, *, c: str, d: str = "x"):
        """Do it.

        Args:
            a: A.
            b: B.
            c: C.
            d: D.
        """
    '''

    schema = schema_of(source)

    assert schema["parameters"]["required"] == ["a", "c"]
    assert list(schema["parameters"]["properties"]) == ["a", "b", "c", "d"]


def test_positional_only_parameters_are_included():
    source = '''
    def f(a: int, /, b: int):
        """Do it.

        Args:
            a: A.
            b: B.
        """
    '''

    schema = schema_of(source)

    assert schema["parameters"]["required"] == ["a", "b"]


def test_injected_parameters_are_left_out():
    source = '''
    def f(self, agent_state, query: str):
        """Search.

        Args:
            query: What to look for.
        """
    '''

    schema = schema_of(source)

    assert schema["parameters"] == {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to look for."}},
        "required": ["query"],
    }


def test_the_last_top_level_function_is_the_tool_by_default():
    source = '''
    def helper(x):
        return x

    class Thing:
        def method(self) -> None:
            """Not a tool."""

    async def fetch(url: str) -> str:
        """Fetch a page.

        Args:
            url: The address.
        """
    '''

    schema = schema_of(source)

    assert schema["name"] == "fetch"


def test_name_selects_the_function():
    source = '''
    def first(a: int):
        """First tool.

        Args:
            a: A.
        """

    def second():
        """Second tool."""
    '''

    schema = schema_of(source, name="first")

    assert schema["name"] == "first"
    assert schema["description"] == "First tool."


def test_source_is_never_executed():
    source = '''
    raise SystemExit("the tool source was executed")

    def f() -> None:
        """Safe."""
    '''

    schema = schema_of(source)

    assert schema["name"] == "f"


def test_error_is_an_invalid_input_with_a_stable_code():
    with pytest.raises(ToolSchemaError) as excinfo:
        generate_schema("x = 1")

    assert isinstance(excinfo.value, InvalidInput)
    assert excinfo.value.code == "invalid_tool_schema"


def test_source_that_does_not_parse_names_the_line():
    message = error_of("def ok():\n    pass\n\ndef broken(:\n    pass\n")

    assert message == "tool source does not parse: line 4: invalid syntax"


def test_source_with_null_bytes_is_refused():
    message = error_of("def f():\x00 pass")

    assert message == "tool source does not parse: source code string cannot contain null bytes"


def test_non_string_source_is_refused():
    with pytest.raises(ToolSchemaError) as excinfo:
        generate_schema(b"def f(): pass")

    assert str(excinfo.value) == "tool source code must be a string"


def test_source_without_a_function_is_refused():
    message = error_of("import os\nx = 1\n")

    assert message == "tool source defines no top-level function"


def test_missing_named_function_is_refused():
    message = error_of("def f():\n    '''Doc.'''\n", name="g")

    assert message == "tool source has no top-level function named 'g'"


def test_function_without_docstring_is_refused():
    message = error_of("def f(a: int):\n    return a\n")

    assert message == (
        "tool 'f' has no docstring; describe the tool and each parameter "
        "in a Google-style docstring (with an Args: section)"
    )


def test_undocumented_parameter_is_refused():
    source = '''
    def f(a: int, b: int):
        """Do it.

        Args:
            a: A.
        """
    '''

    message = error_of(source)

    assert message == "parameter 'b' of tool 'f' is not described in the docstring's Args section"


def test_parameter_with_empty_description_is_refused():
    source = '''
    def f(a: int):
        """Do it.

        Args:
            a:
        """
    '''

    message = error_of(source)

    assert message == "parameter 'a' of tool 'f' is not described in the docstring's Args section"


def test_unannotated_parameter_is_refused():
    source = '''
    def f(a):
        """Do it.

        Args:
            a: A.
        """
    '''

    message = error_of(source)

    assert message == "parameter 'a' of tool 'f' has no type annotation"


def test_unsupported_type_is_refused():
    source = '''
    def f(a: set[int]):
        """Do it.

        Args:
            a: A.
        """
    '''

    message = error_of(source)

    assert message == (
        "parameter 'a' of tool 'f' has an unsupported type annotation 'set[int]': supported types are "
        "str, int, float, bool, list[...], dict, tuple[...], Optional[...] / X | None or Literal[...]"
    )


def test_general_union_is_refused():
    source = '''
    def f(a: int | str | None):
        """Do it.

        Args:
            a: A.
        """
    '''

    message = error_of(source)

    assert message == (
        "parameter 'a' of tool 'f' has an unsupported type annotation 'int | str | None': "
        "unions other than Optional[X] / X | None are not supported"
    )


def test_mixed_literal_is_refused():
    source = '''
    def f(a: Literal["x", 1]):
        """Do it.

        Args:
            a: A.
        """
    '''

    message = error_of(source)

    assert message == (
        "parameter 'a' of tool 'f' has an unsupported type annotation 'Literal['x', 1]': "
        "Literal values must all be strings, all numbers or all booleans"
    )


def test_variable_length_tuple_is_refused():
    source = '''
    def f(a: tuple[int, ...]):
        """Do it.

        Args:
            a: A.
        """
    '''

    message = error_of(source)

    assert message == (
        "parameter 'a' of tool 'f' has an unsupported type annotation 'tuple[int, ...]': "
        "variable-length tuples are not supported"
    )


def test_star_args_are_refused():
    message = error_of('def f(*items: str):\n    """Do it."""\n')

    assert message == "tool 'f' cannot take *items; list each parameter explicitly"


def test_star_star_kwargs_are_refused():
    message = error_of('def f(**options: str):\n    """Do it."""\n')

    assert message == "tool 'f' cannot take **options; list each parameter explicitly"


def test_docstring_parser_reads_args_and_returns():
    text = textwrap.dedent(
        """\
        Summary.

        Arguments:
            a (int, optional): First.
            *b: Second
              continued.

        Returns:
            str: The result
            text.
        """
    )

    docstring = parse_google_docstring(text)

    assert docstring == Docstring(
        description="Summary.",
        params={"a": "First.", "b": "Second\ncontinued."},
        returns="str: The result\ntext.",
    )


def test_docstring_parser_without_sections_is_all_description():
    docstring = parse_google_docstring("Just a summary.\n\nAnd more.")

    assert docstring == Docstring(description="Just a summary.\n\nAnd more.", params={}, returns=None)


# --- bounded work: the parser is linear in its input (issue 16) --------------------------------------------

WORST_CASE_BYTES = 64 * 1024
"""TOOL_SOURCE_MAX_BYTES's default: the largest source the server parses."""

ENTRY_BEFORE_ISSUE_16 = re.compile(r"^\*{0,2}(?P<name>\w+)\s*(?:\([^)]*\))?\s*:(?P<text>.*)$")
"""The Args-entry pattern the parser used to have: `\\s*(...)?\\s*` tries every split of a run of blanks
that no colon follows, so one such line cost the square of its length (80 KB of source: 11 s)."""


def worst_case_docstring(size: int) -> str:
    """An Args line of a name, blanks and no colon: tabs, since each becomes 8 blanks once expanded."""
    head, tail = "Summary.\n\nArgs:\n    x", "y\n    x: The x.\n"
    return head + "\t" * (size - len(head) - len(tail)) + tail


def test_the_parser_takes_a_worst_case_docstring_the_size_of_the_source_limit_in_well_under_a_second():
    # In a child process, so that a quadratic parser (minutes here) fails the test instead of hanging it.
    child = textwrap.dedent(
        f"""
        import json, time
        from apps.tools.schema import generate_schema, parse_google_docstring
        from tests.tools.test_schema import worst_case_docstring
        doc = worst_case_docstring({WORST_CASE_BYTES})
        source = "def f(x: str):\\n    '''" + doc.replace("\\n", "\\n    ") + "'''\\n"
        started = time.perf_counter()
        parsed = parse_google_docstring(doc)
        parse_s = time.perf_counter() - started
        started = time.perf_counter()
        schema = generate_schema(source)
        generate_s = time.perf_counter() - started
        print(json.dumps({{"params": parsed.params, "x": schema["parameters"]["properties"]["x"],
                          "parse_s": parse_s, "generate_s": generate_s}}))
        """
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", child], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"parsing a {WORST_CASE_BYTES}-byte worst-case docstring took more than 30 s")
    result = json.loads(done.stdout)

    assert result["params"] == {"x": "The x."}
    assert result["x"] == {"type": "string", "description": "The x."}
    assert result["parse_s"] < 0.5
    assert result["generate_s"] < 0.5


def test_the_args_entry_pattern_matches_exactly_what_it_did_before_it_became_linear():
    alphabet = "ab_1 \t():*"
    rng = random.Random(16)
    lines = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14))) for _ in range(20_000)}
    lines |= {"x (int): Text", "x   (int)   :  Text", "x : t", "**kwargs: t", "x (a) b: t", "x y: t", "x(:"}

    for line in sorted(lines):
        expanded = ("    " + line).expandtabs().strip()
        old = ENTRY_BEFORE_ISSUE_16.match(expanded)
        expected = {old.group("name"): old.group("text").strip()} if old else {}
        assert parse_google_docstring(f"Args:\n    {line}\n").params == expected, repr(line)


def test_valid_tool_names_are_returned():
    names = [
        validate_tool_name("send_message"),
        validate_tool_name("_private2"),
        validate_tool_name("x" * 64),
    ]

    assert names == ["send_message", "_private2", "x" * 64]


def test_tool_name_with_spaces_is_refused():
    with pytest.raises(ToolSchemaError) as excinfo:
        validate_tool_name("send message")

    assert str(excinfo.value) == (
        "tool name 'send message' is not a valid identifier: use ASCII letters, digits and underscores, "
        "not starting with a digit"
    )


def test_tool_name_starting_with_a_digit_is_refused():
    with pytest.raises(ToolSchemaError) as excinfo:
        validate_tool_name("2fast")

    assert str(excinfo.value) == (
        "tool name '2fast' is not a valid identifier: use ASCII letters, digits and underscores, "
        "not starting with a digit"
    )


def test_non_ascii_tool_name_is_refused():
    with pytest.raises(ToolSchemaError) as excinfo:
        validate_tool_name("café")

    assert str(excinfo.value) == (
        "tool name 'café' is not a valid identifier: use ASCII letters, digits and underscores, "
        "not starting with a digit"
    )


def test_keyword_tool_name_is_refused():
    with pytest.raises(ToolSchemaError) as excinfo:
        validate_tool_name("class")

    assert str(excinfo.value) == "tool name 'class' is a Python keyword"


def test_empty_tool_name_is_refused():
    with pytest.raises(ToolSchemaError) as excinfo:
        validate_tool_name("")

    assert str(excinfo.value) == "tool name must not be empty"


def test_non_string_tool_name_is_refused():
    with pytest.raises(ToolSchemaError) as excinfo:
        validate_tool_name(None)

    assert str(excinfo.value) == "tool name must be a string"


def test_overlong_tool_name_is_refused():
    with pytest.raises(ToolSchemaError) as excinfo:
        validate_tool_name("x" * 65)

    assert str(excinfo.value) == f"tool name '{'x' * 65}' is longer than 64 characters"
