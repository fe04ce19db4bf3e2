"""Tool behaviours a Letta user relies on: return limits, failing tools, nested (pydantic) arguments,
renames, repeated tool rules and Letta's whole base tool set, through /v1 and the agent loop (scripted LLM)."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from apps.agents.models import Agent, Run
from apps.tools.models import Tool
from apps.tools.services import tool_upsert
from tests.support.scripted_llm import text, tool_call, tool_calls

LONG_SOURCE = '''
def long_text(n: int) -> str:
    """Return n x characters.

    Args:
        n (int): How many.
    """
    return "x" * n
'''

RAISING_SOURCE = '''
def flaky(attempt: int) -> str:
    """Always fails.

    Args:
        attempt (int): Which attempt this is.
    """
    raise ConnectionError(f"service down (attempt {attempt})")
'''

PLAN_MODELS = '''
from pydantic import BaseModel, Field


class Step(BaseModel):
    """One step of a plan."""

    name: str = Field(..., description="Name of the step.")
    minutes: int | None = Field(None, description="How long it takes.")


class Plan(BaseModel):
    title: str = Field(description="What the plan is for.")
    steps: list[Step] = Field(..., description="The steps, in order.")

'''

PYDANTIC_SOURCE = (
    PLAN_MODELS
    + '''
def make_plan(plan: Plan, owner: str = "me") -> str:
    """Store a plan.

    Args:
        plan (Plan): The plan to store.
        owner (str): Whose plan it is.
    """
    return plan.title
'''
)

STEP_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Name of the step."},
        "minutes": {"type": "integer", "description": "How long it takes."},
    },
    "required": ["name"],
    "description": "One step of a plan.",
}

NESTED_SOURCE = '''
def summarise_plan(title: str, steps: list) -> str:
    """Describe a plan.

    Args:
        title (str): What the plan is for.
        steps (list): The steps.
    """
    return title + ": " + ", ".join(f"{s['name']} ({s['minutes']} min)" for s in steps)
'''


class StepArgs(BaseModel):
    name: str = Field(..., description="Name of the step.")
    minutes: int | None = Field(None, description="How long it takes.")


class PlanArgs(BaseModel):
    title: str = Field(..., description="What the plan is for.")
    steps: list[StepArgs] = Field(..., description="The steps, in order.")


def tool_returns(result):
    return [m.tool_returns[0] for m in result.messages if m.role == "tool"]


def seen_by_model(request: dict) -> str:
    return json.loads(request["messages"][-1]["content"])["message"]


# --- return_char_limit --------------------------------------------------------------------------------


def test_the_loop_cuts_a_tool_return_to_its_return_char_limit(actor, make_agent, send, llm, settings):
    settings.SANDBOX_BACKEND = "local"
    tool = tool_upsert(actor=actor, source_code=LONG_SOURCE, return_char_limit=10)
    agent = make_agent(tool_ids=[tool.id])
    llm.push(tool_calls(tool_call("long_text", {"n": 500})), text("Done."))

    result = send(agent, "go")

    returned = tool_returns(result)[0]["tool_return"]
    assert returned == "x" * 10 + "... [NOTE: the function returned 500 characters; cut to 10]"
    assert seen_by_model(llm.chat_requests()[1]) == returned


def test_tools_run_cuts_a_stored_tools_return_to_its_limit(actor, api_client_for, settings):
    settings.SANDBOX_BACKEND = "local"
    tool = tool_upsert(actor=actor, source_code=LONG_SOURCE, return_char_limit=10)

    response = api_client_for(actor).post(
        "/v1/tools/run", {"tool_id": tool.id, "args": {"n": 500}}, format="json"
    )

    assert (
        response.json()["tool_return"]
        == "x" * 10 + "... [NOTE: the function returned 500 characters; cut to 10]"
    )


def test_running_an_agents_tool_cuts_its_return_to_its_limit(actor, make_agent, api_client_for, settings):
    settings.SANDBOX_BACKEND = "local"
    tool = tool_upsert(actor=actor, source_code=LONG_SOURCE, return_char_limit=10)
    agent = make_agent(tool_ids=[tool.id])

    response = api_client_for(actor).post(
        f"/v1/agents/{agent.id}/tools/long_text/run", {"args": {"n": 500}}, format="json"
    )

    assert (
        response.json()["func_return"]
        == "x" * 10 + "... [NOTE: the function returned 500 characters; cut to 10]"
    )


# --- a tool that always raises ------------------------------------------------------------------------


def test_a_tool_that_always_raises_gives_an_error_each_time_and_the_turn_ends_cleanly(
    actor, make_agent, send, llm, settings
):
    settings.SANDBOX_BACKEND = "local"
    tool = tool_upsert(actor=actor, source_code=RAISING_SOURCE)
    agent = make_agent(tool_ids=[tool.id])
    llm.push(
        *[tool_calls(tool_call("flaky", {"attempt": attempt})) for attempt in (1, 2, 3)],
        text("The service is down; I will try later."),
    )

    result = send(agent, "try it")

    returns = tool_returns(result)
    assert [r["status"] for r in returns] == ["error", "error", "error"]
    assert [r["tool_return"].strip().splitlines()[-1] for r in returns] == [
        f"ConnectionError: service down (attempt {attempt})" for attempt in (1, 2, 3)
    ]
    assert (result.stop_reason, result.run.status) == ("end_turn", Run.Status.COMPLETED)
    assert result.messages[-1].role == "assistant"
    assert len(llm.chat_requests()) == 4


# --- nested (pydantic) arguments ----------------------------------------------------------------------


def test_a_tool_taking_pydantic_models_gets_nested_object_schemas(actor, api_client_for):
    response = api_client_for(actor).post("/v1/tools/", {"source_code": PYDANTIC_SOURCE}, format="json")

    assert response.status_code == 200
    assert response.json()["json_schema"] == {
        "name": "make_plan",
        "description": "Store a plan.",
        "parameters": {
            "type": "object",
            "properties": {
                "plan": {
                    "type": "object",
                    "properties": {
                        "title": {"type": "string", "description": "What the plan is for."},
                        "steps": {
                            "type": "array",
                            "items": STEP_SCHEMA,
                            "description": "The steps, in order.",
                        },
                    },
                    "required": ["title", "steps"],
                    "description": "The plan to store.",
                },
                "owner": {"type": "string", "description": "Whose plan it is."},
            },
            "required": ["plan"],
        },
    }


def test_a_model_field_without_a_description_is_refused_naming_it(actor, api_client_for):
    source = PYDANTIC_SOURCE.replace('title: str = Field(description="What the plan is for.")', "title: str")

    response = api_client_for(actor).post("/v1/tools/", {"source_code": source}, format="json")

    assert response.status_code == 400
    assert response.json()["detail"] == (
        "field 'title' of model 'Plan' (parameter 'plan' of tool 'make_plan') has no description; "
        "give it one with Field(description=...)"
    )
    assert not Tool.objects.for_actor(actor).filter(name="make_plan").exists()


def test_an_args_schema_from_a_pydantic_model_is_inlined_and_the_tool_gets_nested_objects(
    actor, api_client_for, make_agent, send, llm, settings
):
    settings.SANDBOX_BACKEND = "local"
    created = api_client_for(actor).post(
        "/v1/tools/",
        {"source_code": NESTED_SOURCE, "args_json_schema": PlanArgs.model_json_schema()},
        format="json",
    )
    agent = make_agent(tool_ids=[created.json()["id"]])
    steps = [{"name": "pack", "minutes": 10}, {"name": "drive", "minutes": 60}]
    llm.push(tool_calls(tool_call("summarise_plan", {"title": "Trip", "steps": steps})), text("Planned."))

    result = send(agent, "plan my trip")

    parameters = created.json()["json_schema"]["parameters"]
    assert parameters["properties"]["steps"] == {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "Name of the step."},
                "minutes": {"type": "integer", "description": "How long it takes.", "default": None},
            },
            "required": ["name"],
        },
        "description": "The steps, in order.",
    }
    assert "$defs" not in parameters
    assert llm.chat_requests()[0]["tools"][-1]["function"]["parameters"] == parameters
    assert tool_returns(result)[0]["tool_return"] == "Trip: pack (10 min), drive (60 min)"


# --- renaming, repeated rules -------------------------------------------------------------------------


def test_a_tool_is_renamed_by_sending_its_new_source_and_schema_together(actor, api_client_for):
    tool = tool_upsert(actor=actor, source_code=LONG_SOURCE)
    source = LONG_SOURCE.replace("def long_text", "def many_x")
    schema = {
        "name": "many_x",
        "description": "Many x characters.",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer", "description": "How many."}},
            "required": ["n"],
        },
    }

    response = api_client_for(actor).patch(
        f"/v1/tools/{tool.id}", {"source_code": source, "json_schema": schema}, format="json"
    )

    assert response.status_code == 200
    assert (response.json()["name"], response.json()["json_schema"]) == ("many_x", schema)
    tool.refresh_from_db()
    assert (tool.name, tool.source_code) == ("many_x", source)


def test_a_tool_rule_given_twice_is_stored_once(actor, api_client_for, llm):
    rule = {"type": "exit_loop", "tool_name": "send_message"}
    first = {"type": "run_first", "tool_name": "conversation_search"}
    client = api_client_for(actor)

    created = client.post(
        "/v1/agents/",
        {"name": "Ruled", "model": "openai/gpt-4o-mini", "tool_rules": [first, rule, first, rule]},
        format="json",
    )
    patched = client.patch(f"/v1/agents/{created.json()['id']}", {"tool_rules": [rule, rule]}, format="json")

    assert created.status_code == 200
    assert [r["type"] for r in created.json()["tool_rules"]] == ["run_first", "exit_loop"]
    assert [r["type"] for r in patched.json()["tool_rules"]] == ["exit_loop"]
    assert Agent.objects.for_actor(actor).get().tool_rules == [
        {"type": "exit_loop", "tool_name": "send_message"}
    ]


# --- Letta's whole base tool set ----------------------------------------------------------------------


def test_a_fresh_organisation_lists_lettas_whole_base_tool_set(actor, api_client_for):
    names = {tool["name"] for tool in api_client_for(actor).get("/v1/tools/", {"limit": 100}).json()}

    assert {
        "memory",
        "memory_apply_patch",
        "send_message_to_agent_and_wait_for_reply",
        "send_message_to_agents_matching_tags",
        "send_message_to_agent_async",
        "open_files",
        "grep_files",
        "semantic_search_files",
        "web_search",
        "fetch_webpage",
        "run_code",
        "run_code_with_tools",
        "store_memories",
        "search_memory",
    } <= names
    assert len(names) == 27  # and this server's load_skill


def test_a_base_tool_not_built_yet_resolves_by_name_and_answers_an_error_saying_so(
    actor, api_client_for, send, llm
):
    created = api_client_for(actor).post(
        "/v1/agents/",
        {
            "name": "Searcher",
            "model": "openai/gpt-4o-mini",
            "tools": ["web_search"],
            "include_base_tools": False,
        },
        format="json",
    )
    agent = Agent.objects.for_actor(actor).get(id=created.json()["id"])
    llm.push(tool_calls(tool_call("web_search", {"query": "letta"})), text("I cannot search the web."))

    result = send(agent, "search for letta")

    assert [t["name"] for t in created.json()["tools"]] == ["web_search"]
    assert tool_returns(result)[0]["status"] == "error"
    assert tool_returns(result)[0]["tool_return"] == (
        "The built-in tool 'web_search' is not available on this server yet: its call did nothing. "
        "Carry on without it."
    )
    assert (result.stop_reason, result.run.status) == ("end_turn", Run.Status.COMPLETED)


@pytest.mark.parametrize(
    ("name", "parameter", "items"),
    [
        ("open_files", "file_requests", {"file_name", "offset", "length"}),
        ("store_memories", "chunks", {"start_index", "end_index", "context"}),
    ],
)
def test_base_tools_taking_lists_of_models_describe_their_items(
    actor, api_client_for, name, parameter, items
):
    tools = api_client_for(actor).get("/v1/tools/", {"name": name}).json()

    schema = tools[0]["json_schema"]["parameters"]["properties"][parameter]
    assert (schema["type"], schema["items"]["type"]) == ("array", "object")
    assert set(schema["items"]["properties"]) == items


def test_a_custom_tool_that_already_had_a_base_tools_name_keeps_its_code(actor, api_client_for):
    source = LONG_SOURCE.replace("def long_text", "def web_search")
    mine = Tool.objects.for_actor(actor).create(name="web_search", source_code=source, tool_type="custom")

    api_client_for(actor).get("/v1/tools/")

    mine.refresh_from_db()
    assert (mine.tool_type, mine.source_code) == ("custom", source)
