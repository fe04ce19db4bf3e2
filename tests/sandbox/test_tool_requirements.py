"""A tool's own pip requirements (Letta's Tool.pip_requirements): built into the sandbox image it runs on,
set only by owners and admins, packages from the index only; and what POST /v1/tools/run does with the
rest of Letta's ToolRunFromSource (source_type, npm_requirements, json_schema).
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from docker.errors import ImageNotFound

from apps.agents.custom_tools import run_custom_tool
from apps.core.actor import Actor, Role
from apps.sandbox import docker_sandbox, images
from apps.sandbox.docker_sandbox import get_client
from apps.tools.execution import ToolContext
from apps.tools.models import Tool
from tests.agents.test_loop import custom_tool
from tests.sandbox.test_docker import make_wheel

PROBE_SOURCE = '''
def probe() -> str:
    """Says where its package came from."""
    import letta_sandbox_probe
    return letta_sandbox_probe.VALUE
'''

TOOL_SOURCE = '''
def weather(city: str) -> str:
    """The weather.

    Args:
        city (str): Which city.
    """
    return "sunny in " + city
'''


def as_role(org: Any, make_user: Any, role: Role) -> Actor:
    return Actor(organization_id=org.id, user_id=make_user(org, role=role).id, role=role)


@pytest.mark.docker
def test_a_tools_own_requirements_are_installed_in_the_image_it_runs_on(docker_settings, org, tmp_path):
    make_wheel(tmp_path)
    docker_settings.SANDBOX_WHEELHOUSE = str(tmp_path)
    docker_settings.SANDBOX_PIP_NO_INDEX = True
    tool = custom_tool(
        org, name="probe", source=PROBE_SOURCE, pip_requirements=[{"name": "letta-sandbox-probe"}]
    )
    without = custom_tool(org, name="probe_bare", source=PROBE_SOURCE.replace("def probe", "def probe_bare"))
    context = ToolContext(actor=Actor.system(org.id), agent_id="agent-x")
    plan = images.plan_image(
        base=docker_settings.SANDBOX_BASE_IMAGE,
        base_id=images.ensure_image(docker_settings.SANDBOX_BASE_IMAGE, pull=False),
        requirements=tool.pip_requirements,
        wheelhouse=tmp_path,
        no_index=True,
    )
    try:
        ran = run_custom_tool(tool, {}, context)
        bare = run_custom_tool(without, {}, context)
    finally:
        if docker_sandbox._pool is not None:
            docker_sandbox._pool.shutdown()  # no container may hold the image
        with contextlib.suppress(ImageNotFound):
            get_client().images.remove(plan.tag, force=True)

    assert (ran.status, ran.return_value, ran.sandbox) == (
        "success",
        "installed from a local wheel",
        "docker",
    )
    assert bare.status == "error"
    assert "No module named 'letta_sandbox_probe'" in bare.return_value


def test_the_local_jail_refuses_a_tool_with_requirements_saying_why(settings, org):
    settings.SANDBOX_BACKEND = "local"
    tool = custom_tool(org, name="probe", source=PROBE_SOURCE, pip_requirements=[{"name": "requests"}])

    ran = run_custom_tool(tool, {}, ToolContext(actor=Actor.system(org.id), agent_id="agent-x"))

    assert ran.status == "error"
    assert "the local sandbox installs no packages and the tool lists pip requirements" in ran.return_value


@pytest.mark.django_db
def test_only_owners_and_admins_give_a_tool_pip_requirements(org, make_user, api_client_for):
    requirements = [{"name": "requests", "version": "2.32.3"}]
    member = api_client_for(as_role(org, make_user, Role.MEMBER))
    admin = api_client_for(as_role(org, make_user, Role.ADMIN))

    refused = member.post(
        "/v1/tools/", {"source_code": TOOL_SOURCE, "pip_requirements": requirements}, format="json"
    )
    created = member.post("/v1/tools/", {"source_code": TOOL_SOURCE}, format="json")
    tool_path = f"/v1/tools/{created.json()['id']}"
    given = admin.patch(tool_path, {"pip_requirements": requirements}, format="json")
    # The member may still edit their tool, sending its packages back as they are, but not change them.
    kept = member.patch(tool_path, {"description": "Sunny.", "pip_requirements": requirements}, format="json")
    changed = member.patch(tool_path, {"pip_requirements": [{"name": "numpy"}]}, format="json")

    assert refused.status_code == 403
    assert "pip requirements" in refused.json()["detail"]
    assert (created.status_code, given.status_code, kept.status_code) == (200, 200, 200)
    assert changed.status_code == 403
    tool = Tool.all_objects.get(id=created.json()["id"])
    assert (tool.description, tool.pip_requirements) == ("Sunny.", requirements)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "requirement",
    [
        "probe @ http://10.0.0.1/probe-1.0-py3-none-any.whl",
        {"name": "probe @ https://example.com/probe.whl"},
        "--index-url=https://evil.example/simple requests",
    ],
)
def test_requirements_that_would_fetch_from_anywhere_but_the_index_are_refused(
    org, make_user, api_client_for, requirement
):
    admin = api_client_for(as_role(org, make_user, Role.OWNER))
    as_tool = [requirement] if isinstance(requirement, dict) else [{"name": requirement}]

    tool = admin.post("/v1/tools/", {"source_code": TOOL_SOURCE, "pip_requirements": as_tool}, format="json")
    config = admin.post("/v1/sandbox-config/", {"config": {"pip_requirements": [requirement]}}, format="json")

    assert tool.status_code == 400
    assert tool.json()["detail"].startswith("pip_requirements: Invalid pip requirement")
    assert config.status_code in (400, 422)
    assert not Tool.all_objects.filter(organization=org, name="weather").exists()


def test_the_image_build_installs_wheels_only():
    plan = images.ImagePlan(base="base", requirements=("requests==2.32.3",), tag="letta-sandbox-deps:x")

    assert "--only-binary=:all:" in images.dockerfile(plan, has_wheels=False, no_index=False)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("source_type", "typescript", "only 'python' tools run here"),
        ("npm_requirements", [{"name": "lodash"}], "no npm packages"),
        ("json_schema", {"name": "other", "parameters": {}}, "differs"),
    ],
)
def test_tools_run_refuses_what_it_cannot_honour_naming_the_field(
    org, make_user, api_client_for, field, value, says
):
    admin = api_client_for(as_role(org, make_user, Role.OWNER))
    body = {"source_code": TOOL_SOURCE, "name": "weather", "args": {"city": "Rome"}, field: value}

    response = admin.post("/v1/tools/run", body, format="json")

    assert response.status_code == 422
    assert field in str(response.json())
    assert says in str(response.json())
