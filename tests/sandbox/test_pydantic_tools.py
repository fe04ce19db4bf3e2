"""Custom tools whose parameters are pydantic models run with model instances, as in Letta: the sandbox
builds them from the tool's own classes (nested models and lists of models included), and arguments that
do not fit are an error tool-return naming each wrong field. Through `POST /v1/tools/run` and the agent
loop, in the Docker sandbox (pydantic in the base image) and in the local jail (the platform's pydantic,
bound read-only), each test once per backend.
"""

from __future__ import annotations

import contextlib
import json
import stat
import uuid

from docker.errors import ImageNotFound

from apps.sandbox import local
from apps.sandbox.docker_sandbox import get_client
from apps.sandbox.local import JAIL_SITE, pydantic_site, run_tool_locally
from apps.tools.services import tool_upsert
from tests.api.test_tools_behaviour import PLAN_MODELS
from tests.sandbox.conftest import ROOT, build_image
from tests.support.scripted_llm import text, tool_call, tool_calls

PLAN_SOURCE = (
    PLAN_MODELS
    + '''
def copy_plan(plan: Plan) -> Plan:
    """Give the plan back.

    Args:
        plan (Plan): The plan.
    """
    return plan.model_copy(update={"title": plan.title.upper()})


def make_plan(plan: Plan, owner: str = "me") -> str:
    """Store a plan.

    Args:
        plan (Plan): The plan to store.
        owner (str): Whose plan it is.
    """
    print("make_plan was called")
    steps = ", ".join(f"{s.name} ({type(s).__name__}, {s.minutes} min)" for s in plan.steps)
    return f"{type(plan).__name__} {plan.title} for {owner}: {steps}"

'''
)

SHAPES_SOURCE = '''
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, Field


class Trip(BaseModel):
    legs: list[Leg] = Field(description="Legs, defined below this class.")


class Leg(BaseModel):
    to: str = Field(description="Where to.")


def shapes(trip: Trip, by_day: dict[str, Leg], spare: Optional[Leg] = None) -> list:
    """Shapes of model arguments.

    Args:
        trip (Trip): a model whose field refers to a model defined after it
        by_day (dict): models as dictionary values
        spare (Leg): an optional model
    """
    return [
        [type(leg).__name__ + ":" + leg.to for leg in trip.legs],
        {day: type(leg).__name__ + ":" + leg.to for day, leg in by_day.items()},
        spare,
    ]
'''

V1_SOURCE = '''
from pydantic.v1 import BaseModel, Field


class Step(BaseModel):
    name: str = Field(description="Name of the step.")
    minutes: int = Field(5, description="How long it takes.")


def total(steps: list[Step]) -> int:
    """Minutes of all the steps.

    Args:
        steps (list): the steps
    """
    return sum(step.minutes for step in steps)
'''

PLAN = {"title": "Trip", "steps": [{"name": "pack", "minutes": 10}, {"name": "drive", "minutes": "60"}]}
BAD_PLAN = {"steps": [{"name": "pack", "minutes": "soon"}, {"minutes": 3}]}
BAD_PLAN_ERROR = (
    "Error executing tool make_plan: Invalid arguments: 'plan' is not a valid Plan:\n"
    "- plan.title: Field required\n"
    "- plan.steps.0.minutes: Input should be a valid integer, unable to parse string as an integer "
    "(got 'soon')\n"
    "- plan.steps.1.name: Field required"
)


def run(api_client_for, actor, source: str, name: str, args: dict) -> dict:
    response = api_client_for(actor).post(
        "/v1/tools/run", {"source_code": source, "name": name, "args": args}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()


def tool_returns(result):
    return [m.tool_returns[0] for m in result.messages if m.role == "tool"]


def seen_by_model(request: dict) -> str:
    return json.loads(request["messages"][-1]["content"])["message"]


# --- /v1/tools/run -------------------------------------------------------------------------------------


def test_a_pydantic_argument_arrives_as_the_tools_own_model_with_nested_models(
    backend, actor, api_client_for
):
    result = run(api_client_for, actor, PLAN_SOURCE, "make_plan", {"plan": PLAN, "owner": "sam"})

    assert (result["status"], result["sandbox"]) == ("success", backend), result["tool_return"]
    assert result["tool_return"] == "Plan Trip for sam: pack (Step, 10 min), drive (Step, 60 min)"


def test_arguments_that_do_not_fit_the_model_are_an_error_naming_each_field(backend, actor, api_client_for):
    result = run(api_client_for, actor, PLAN_SOURCE, "make_plan", {"plan": BAD_PLAN})

    assert (result["status"], result["sandbox"]) == ("error", backend)
    assert result["tool_return"] == BAD_PLAN_ERROR
    assert result["stdout"] == []  # the tool was not called


def test_a_model_the_tool_returns_comes_back_as_its_json(backend, actor, api_client_for):
    result = run(api_client_for, actor, PLAN_SOURCE, "copy_plan", {"plan": PLAN})

    assert (result["status"], result["sandbox"]) == ("success", backend), result["tool_return"]
    assert json.loads(result["tool_return"]) == {
        "title": "TRIP",
        "steps": [{"name": "pack", "minutes": 10}, {"name": "drive", "minutes": 60}],
    }


def test_forward_references_dicts_and_optional_models_are_built_too(backend, actor, api_client_for):
    args = {"trip": {"legs": [{"to": "Lyon"}, {"to": "Turin"}]}, "by_day": {"mon": {"to": "Genoa"}}}

    result = run(api_client_for, actor, SHAPES_SOURCE, "shapes", args)

    assert (result["status"], result["sandbox"]) == ("success", backend), result["tool_return"]
    assert json.loads(result["tool_return"]) == [["Leg:Lyon", "Leg:Turin"], {"mon": "Leg:Genoa"}, None]


def test_a_model_sent_as_a_json_string_is_decoded_first(backend, actor, api_client_for):
    result = run(api_client_for, actor, PLAN_SOURCE, "make_plan", {"plan": json.dumps(PLAN)})

    assert (result["status"], result["sandbox"]) == ("success", backend), result["tool_return"]
    assert result["tool_return"] == "Plan Trip for me: pack (Step, 10 min), drive (Step, 60 min)"


def test_pydantic_v1_models_are_built_with_the_v1_api(backend, actor, api_client_for):
    good = run(
        api_client_for, actor, V1_SOURCE, "total", {"steps": [{"name": "a", "minutes": "4"}, {"name": "b"}]}
    )
    bad = run(api_client_for, actor, V1_SOURCE, "total", {"steps": [{"minutes": 1}]})

    assert (good["status"], good["sandbox"], good["tool_return"]) == ("success", backend, "9")
    assert bad["tool_return"] == (
        "Error executing tool total: Invalid arguments: 'steps' is not a valid list[Step]:\n"
        "- steps.0.name: field required"
    )


# --- the agent loop ------------------------------------------------------------------------------------


def test_an_agents_call_gets_model_instances_and_a_bad_one_an_error_it_can_read(
    backend, actor, make_agent, send, llm
):
    tool = tool_upsert(actor=actor, source_code=PLAN_SOURCE)
    agent = make_agent(tool_ids=[tool.id])
    llm.push(
        tool_calls(tool_call("make_plan", {"plan": PLAN}, id="call_1")),
        tool_calls(tool_call("make_plan", {"plan": BAD_PLAN}, id="call_2")),
        text("Planned."),
    )

    result = send(agent, "plan my trip")

    good, bad = tool_returns(result)
    assert (good["status"], good["sandbox"]) == ("success", backend), good["tool_return"]
    assert good["tool_return"] == "Plan Trip for me: pack (Step, 10 min), drive (Step, 60 min)"
    assert (bad["status"], bad["sandbox"], bad["tool_return"]) == ("error", backend, BAD_PLAN_ERROR)
    assert seen_by_model(llm.chat_requests()[2]) == BAD_PLAN_ERROR
    assert (result.stop_reason, result.messages[-1].role) == ("end_turn", "assistant")


# --- what pydantic brings into each sandbox -----------------------------------------------------------

LOOK = '''
import os, sys

def look() -> dict:
    """What the tool sees of pydantic and of the platform's environment."""
    import pydantic
    found = {}
    for name in ("django", "rest_framework", "celery", "apps"):
        try:
            __import__(name)
            found[name] = "importable"
        except ImportError:
            found[name] = "missing"
    try:
        open(os.path.join(os.path.dirname(pydantic.__file__), "x"), "w")
        writable = True
    except OSError:
        writable = False
    site = os.path.dirname(os.path.dirname(pydantic.__file__))
    return {"version": pydantic.VERSION, "site": site, "entries": sorted(os.listdir(site)), "found": found,
            "writable": writable}
'''


def test_the_jail_sees_only_pydantics_own_files_read_only():
    seen = run_tool_locally(source_code=LOOK, name="look", arguments={}, env={}, hidden=(str(ROOT),))

    assert seen.ok, seen.error
    value = seen.return_value
    assert isinstance(value, dict)
    assert (value["version"], value["site"], value["writable"]) == (_our_pydantic(), JAIL_SITE, False)
    assert {entry.split("-")[0] for entry in value["entries"]} == {
        "__pycache__",
        "annotated_types",
        "pydantic",
        "pydantic_core",
        "typing_extensions",
        "typing_extensions.py",
        "typing_inspection",
    }
    assert value["found"] == {
        "django": "missing",
        "rest_framework": "missing",
        "celery": "missing",
        "apps": "missing",
    }


def test_the_docker_image_has_the_platforms_pydantic_read_only(docker_settings, actor, api_client_for):
    result = run(api_client_for, actor, LOOK, "look", {})

    assert (result["status"], result["sandbox"]) == ("success", "docker"), result["tool_return"]
    seen = json.loads(result["tool_return"])
    assert (seen["version"], seen["site"], seen["writable"]) == (
        _our_pydantic(),
        "/usr/local/lib/python3.11/dist-packages",
        False,
    )
    assert seen["found"] == {
        "django": "missing",
        "rest_framework": "missing",
        "celery": "missing",
        "apps": "missing",
    }


def test_an_interpreter_of_another_python_version_is_offered_no_pydantic_and_told_why(tmp_path):
    fake = tmp_path / "python3.99"
    fake.write_text("#!/bin/sh\necho .cpython-399-x86_64-linux-gnu.so\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)

    site = pydantic_site(str(fake))

    assert site.binds == ()
    assert site.reason.startswith(f"its interpreter {fake} is not the platform's Python version")


def test_a_tool_without_pydantic_in_the_jail_is_told_why(monkeypatch):
    monkeypatch.setattr(local, "pydantic_site", lambda python: local.JailSite(reason="no pydantic for you"))

    outcome = run_tool_locally(source_code=PLAN_SOURCE, name="make_plan", arguments={"plan": PLAN}, env={})

    assert outcome.ok is False
    assert "ModuleNotFoundError: No module named 'pydantic'" in (outcome.error or "")
    assert (outcome.error or "").endswith("(The local sandbox offers no pydantic here: no pydantic for you.)")


# --- the image's recipe ---------------------------------------------------------------------------------


def test_an_image_of_an_older_recipe_is_rebuilt_under_its_tag(docker_image):
    client = get_client()
    tag = f"letta-sandbox-base:stale-{uuid.uuid4().hex[:8]}"
    container = client.containers.create(docker_image, command=["true"])
    try:
        container.commit(*tag.split(":"), changes=["LABEL letta.sandbox.recipe=older"])
    finally:
        container.remove(force=True)
    try:
        built = build_image(tag)
        again = build_image(tag, timeout=60)

        assert built.returncode == 0, built.stderr[-3000:]
        assert f"{tag} was built from another recipe (older, now " in built.stderr
        labels = client.images.get(tag).labels
        assert (
            labels["letta.sandbox.recipe"] == client.images.get(docker_image).labels["letta.sandbox.recipe"]
        )
        assert labels["letta.sandbox.pydantic"] == _our_pydantic()
        assert again.stderr.strip().splitlines()[-1] == f"build_sandbox_image: {tag} already present"
    finally:
        with contextlib.suppress(ImageNotFound):
            client.images.remove(tag, force=True)


def _our_pydantic() -> str:
    import pydantic

    return pydantic.VERSION
