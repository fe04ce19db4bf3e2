"""/v1/sandbox-config: an organisation's sandbox configs and variables over the API.

Limits are refused outside the platform's range (the sandbox runner's maxima, SANDBOX_RUNNER_MAX_*) with
a 422 naming the field; variable values never come back; only owners and admins write. The last tests run
a tool in the local jail (bubblewrap) with what the API set. letta-client 1.12.1 has no sandbox-config
methods: the SDK test uses its generic transport.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from letta_client import Letta
from rest_framework.test import APIClient

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.core.actor import Actor, Role
from apps.sandbox.models import SandboxConfig, SandboxEnvironmentVariable

SECRET = "s3cr3t-value-never-shown"
ROOT = "/v1/sandbox-config"


@pytest.fixture
def client(actor: Actor, api_client_for: Any) -> APIClient:
    return api_client_for(actor)


@pytest.fixture
def people(org, make_user) -> dict[str, Actor]:
    actors = {}
    for role in (Role.OWNER, Role.ADMIN, Role.MEMBER):
        user = make_user(org, role=role, username=f"{role}-person")
        actors[role.value] = Actor(organization_id=org.id, user_id=user.id, role=role)
    return actors


def configs(actor: Actor) -> list[SandboxConfig]:
    return list(SandboxConfig.objects.for_actor(actor).order_by("created_at"))


def snapshot(actor: Actor) -> list[tuple[Any, ...]]:
    return [
        (
            c.id,
            c.sandbox_type,
            c.image,
            c.memory_mb,
            c.cpus,
            c.pids_limit,
            c.timeout_seconds,
            c.network_enabled,
        )
        for c in configs(actor)
    ]


def new_config(actor: Actor, **fields: Any) -> SandboxConfig:
    return SandboxConfig.objects.for_actor(actor).create(**fields)


def new_variable(
    config: SandboxConfig, key: str = "API_TOKEN", value: str = SECRET
) -> SandboxEnvironmentVariable:
    return SandboxEnvironmentVariable.objects.for_org(config.organization_id).create(
        sandbox_config=config, key=key, value=value
    )


# --- configs ---------------------------------------------------------------------------------------------


def test_create_a_docker_config_and_unset_settings_take_the_defaults(client, actor):
    response = client.post(
        f"{ROOT}/",
        {"config": {"image": "python:3.12-slim", "memory_mb": 512, "timeout": 60, "network_enabled": True}},
        format="json",
    )

    config = SandboxConfig.objects.for_actor(actor).get()
    body = response.json()
    assert response.status_code == 200
    assert body == {
        "id": config.id,
        "type": "docker",
        "organization_id": actor.organization_id,
        "config": {
            "image": "python:3.12-slim",
            "pip_requirements": [],
            "network_enabled": True,
            "memory_mb": 512,
            "cpus": 1.0,
            "pids_limit": 64,
            "timeout": 60,
        },
        "created_at": body["created_at"],
        "updated_at": body["updated_at"],
    }
    assert (config.memory_mb, config.timeout_seconds, config.network_enabled) == (512, 60, True)


def test_creating_a_type_again_replaces_its_config(client, actor):
    first = client.post(f"{ROOT}/", {"config": {"memory_mb": 512, "pids_limit": 32}}, format="json").json()

    second = client.post(f"{ROOT}/", {"config": {"timeout": 10}}, format="json").json()

    assert second["id"] == first["id"]
    assert (second["config"]["memory_mb"], second["config"]["pids_limit"], second["config"]["timeout"]) == (
        256,
        64,
        10,
    )
    assert len(configs(actor)) == 1


def test_lettas_e2b_template_names_the_docker_image(client, actor):
    response = client.post(
        f"{ROOT}/", {"type": "e2b", "config": {"template": "python:3.12-slim"}}, format="json"
    )

    assert response.json()["type"] == "docker"
    assert response.json()["config"]["image"] == "python:3.12-slim"


def test_a_local_config_has_only_the_jails_settings(client, actor):
    response = client.post(f"{ROOT}/local", {"memory_mb": 300, "timeout": 5}, format="json")

    assert response.status_code == 200
    assert response.json()["type"] == "local"
    assert response.json()["config"] == {
        "pip_requirements": [],
        "memory_mb": 300,
        "pids_limit": 64,
        "timeout": 5,
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"sandbox_dir": "/etc", "use_venv": True}, "sandbox_dir"),
        ({"pip_requirements": [{"name": "requests"}]}, "pip_requirements"),
        ({"network_enabled": True}, "network_enabled"),
        ({"image": "python:3.12-slim"}, "image"),
        ({"cpus": 2}, "cpus"),
    ],
)
def test_a_local_config_refuses_what_the_jail_cannot_do(client, actor, body, field):
    response = client.post(f"{ROOT}/local", body, format="json")

    assert response.status_code == 422
    assert list(response.json()["errors"]) == [field]
    assert configs(actor) == []


@pytest.mark.parametrize("key", ["actor", "sandbox_type", "sandbox_config_id", "fields"])
def test_a_config_key_named_like_a_service_argument_is_refused_by_name(client, actor, key):
    """Found by the schema fuzzer: such a key reached the service as a keyword argument (a 500)."""
    local = client.post(f"{ROOT}/local", {key: 1}, format="json")
    created = client.post(f"{ROOT}/", {"config": {key: 1}}, format="json")
    config_id = client.post(f"{ROOT}/docker/default").json()["id"]
    updated = client.patch(f"{ROOT}/{config_id}", {"config": {key: 1}}, format="json")

    for response in (local, created, updated):
        assert response.status_code == 422, response.content
        assert key in str(response.json()["errors"])


@pytest.mark.parametrize("kind", ["local", "e2b", "docker"])
def test_a_default_config_is_created_once(client, actor, kind):
    first = client.post(f"{ROOT}/{kind}/default")
    again = client.post(f"{ROOT}/{kind}/default")

    assert first.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert first.json()["type"] == ("local" if kind == "local" else "docker")
    assert len(configs(actor)) == 1


def test_list_configs_by_type(client, actor):
    docker = new_config(actor, sandbox_type="docker")
    local = new_config(actor, sandbox_type="local")

    everything = client.get(f"{ROOT}/").json()
    only_local = client.get(f"{ROOT}/?sandbox_type=local").json()
    as_e2b = client.get(f"{ROOT}/?sandbox_type=e2b").json()
    after_first = client.get(f"{ROOT}/?after={docker.id}").json()

    assert [c["id"] for c in everything] == [docker.id, local.id]
    assert [c["id"] for c in only_local] == [local.id]
    assert [c["id"] for c in as_e2b] == [docker.id]
    assert [c["id"] for c in after_first] == [local.id]


def test_update_changes_only_the_settings_given(client, actor):
    config = new_config(actor, sandbox_type="docker", memory_mb=512, image="python:3.12-slim")

    response = client.patch(f"{ROOT}/{config.id}", {"config": {"timeout": 90}}, format="json")

    config.refresh_from_db()
    assert response.status_code == 200
    assert (config.timeout_seconds, config.memory_mb, config.image) == (90, 512, "python:3.12-slim")


def test_delete_a_config_and_its_variables(client, actor):
    config = new_config(actor, sandbox_type="docker")
    new_variable(config)

    response = client.delete(f"{ROOT}/{config.id}")

    assert response.status_code == 204
    assert configs(actor) == []
    assert not SandboxEnvironmentVariable.objects.for_actor(actor).exists()


# --- limits the platform allows --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "value", "field", "detail"),
    [
        (
            "memory_mb",
            4096,
            "config.memory_mb",
            "must be at most 1024 on this platform (SANDBOX_RUNNER_MAX_MEMORY_MB)",
        ),
        ("memory_mb", 2, "config.memory_mb", "must be at least 6"),
        ("memory_mb", "lots", "config.memory_mb", "must be an integer"),
        ("cpus", 16, "config.cpus", "must be at most 2 on this platform (SANDBOX_RUNNER_MAX_CPUS)"),
        ("cpus", 0, "config.cpus", "must be at least 0.01"),
        (
            "pids_limit",
            100000,
            "config.pids_limit",
            "must be at most 256 on this platform (SANDBOX_RUNNER_MAX_PIDS)",
        ),
        (
            "timeout",
            3600,
            "config.timeout",
            "must be at most 300 on this platform (SANDBOX_RUNNER_MAX_TIMEOUT)",
        ),
        ("timeout", 0, "config.timeout", "must be at least 1"),
        ("timeout", 1.5, "config.timeout", "must be an integer"),
        ("network_enabled", "yes", "config.network_enabled", "must be true or false"),
        ("pip_requirements", ["--index-url http://evil"], "config.pip_requirements", None),
        (
            "pip_requirements",
            [{"name": "requests", "index": "http://evil"}],
            "config.pip_requirements",
            "must be a list of PEP 508 strings or {name, version} objects",
        ),
        ("max_threads", 4, "config.max_threads", "is not a sandbox config setting"),
    ],
)
def test_a_setting_outside_the_platforms_range_is_422_naming_it(client, actor, setting, value, field, detail):
    config = new_config(actor, sandbox_type="docker")
    before = snapshot(actor)

    created = client.post(f"{ROOT}/", {"config": {setting: value}}, format="json")
    updated = client.patch(f"{ROOT}/{config.id}", {"config": {setting: value}}, format="json")

    for response in (created, updated):
        assert response.status_code == 422
        assert list(response.json()["errors"]) == [field]
        assert response.json()["detail"].startswith(f"{field}: ")
        if detail is not None:
            assert response.json()["detail"] == f"{field}: {detail}"
    assert snapshot(actor) == before


def test_a_whole_number_written_as_a_float_is_accepted(client, actor):
    response = client.post(f"{ROOT}/", {"config": {"timeout": 45.0, "memory_mb": 512.0}}, format="json")

    assert response.status_code == 200
    assert (response.json()["config"]["timeout"], response.json()["config"]["memory_mb"]) == (45, 512)


def test_the_range_follows_the_operators_maxima(client, actor, settings):
    settings.SANDBOX_RUNNER_MAX_MEMORY_MB = 512

    refused = client.post(f"{ROOT}/", {"config": {"memory_mb": 513}}, format="json")
    accepted = client.post(f"{ROOT}/", {"config": {"memory_mb": 512}}, format="json")

    assert refused.status_code == 422
    assert refused.json()["detail"] == (
        "config.memory_mb: must be at most 512 on this platform (SANDBOX_RUNNER_MAX_MEMORY_MB)"
    )
    assert accepted.json()["config"]["memory_mb"] == 512


def test_the_local_endpoint_names_fields_without_the_config_prefix(client, actor):
    response = client.post(f"{ROOT}/local", {"timeout": 100000}, format="json")

    assert response.status_code == 422
    assert list(response.json()["errors"]) == ["timeout"]


def test_with_a_sandbox_runner_only_its_images_are_accepted(client, actor, settings):
    settings.SANDBOX_RUNNER_URL = "unix:///nonexistent/runner.sock"
    settings.SANDBOX_BASE_IMAGE = "letta-sandbox-base:py3"
    settings.SANDBOX_RUNNER_ALLOWED_IMAGES = ["python:3.12-slim"]

    refused = client.post(f"{ROOT}/", {"config": {"image": "evil/miner:latest"}}, format="json")
    allowed = client.post(f"{ROOT}/", {"config": {"image": "python:3.12-slim"}}, format="json")

    assert refused.status_code == 422
    assert list(refused.json()["errors"]) == ["config.image"]
    assert allowed.status_code == 200
    assert [c.image for c in configs(actor)] == ["python:3.12-slim"]


# --- variables -------------------------------------------------------------------------------------------


def test_a_variable_value_is_stored_encrypted_and_never_returned(client, actor):
    config = new_config(actor, sandbox_type="docker")

    created = client.post(
        f"{ROOT}/{config.id}/environment-variable",
        {"key": "API_TOKEN", "value": SECRET, "description": "for the weather tool"},
        format="json",
    )
    listed = client.get(f"{ROOT}/{config.id}/environment-variable")
    updated = client.patch(
        f"{ROOT}/environment-variable/{created.json()['id']}", {"value": SECRET + "-2"}, format="json"
    )

    variable = SandboxEnvironmentVariable.objects.for_actor(actor).get()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT value FROM {SandboxEnvironmentVariable._meta.db_table}")
        (stored,) = cursor.fetchone()
    assert created.status_code == 200
    assert created.json() == {
        "id": variable.id,
        "key": "API_TOKEN",
        "value": None,
        "description": "for the weather tool",
        "organization_id": actor.organization_id,
        "sandbox_config_id": config.id,
        "created_at": created.json()["created_at"],
        "updated_at": created.json()["updated_at"],
    }
    assert [v["key"] for v in listed.json()] == ["API_TOKEN"]
    for response in (created, listed, updated):
        assert SECRET not in response.content.decode()
    assert variable.value == SECRET + "-2"
    assert SECRET not in stored


def test_a_variable_key_must_be_an_environment_name(client, actor):
    config = new_config(actor, sandbox_type="docker")

    response = client.post(
        f"{ROOT}/{config.id}/environment-variable", {"key": "BAD-NAME=1", "value": "x"}, format="json"
    )

    assert response.status_code == 422
    assert list(response.json()["errors"]) == ["key"]
    assert not SandboxEnvironmentVariable.objects.for_actor(actor).exists()


def test_a_taken_key_is_409(client, actor):
    config = new_config(actor, sandbox_type="docker")
    new_variable(config)
    other = new_variable(config, key="OTHER")

    created = client.post(
        f"{ROOT}/{config.id}/environment-variable", {"key": "API_TOKEN", "value": "x"}, format="json"
    )
    renamed = client.patch(f"{ROOT}/environment-variable/{other.id}", {"key": "API_TOKEN"}, format="json")

    assert (created.status_code, renamed.status_code) == (409, 409)
    assert sorted(SandboxEnvironmentVariable.objects.for_actor(actor).values_list("key", flat=True)) == [
        "API_TOKEN",
        "OTHER",
    ]


def test_delete_a_variable(client, actor):
    variable = new_variable(new_config(actor, sandbox_type="docker"))

    response = client.delete(f"{ROOT}/environment-variable/{variable.id}")

    assert response.status_code == 204
    assert not SandboxEnvironmentVariable.objects.for_actor(actor).exists()


# --- tenancy and roles -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "{config}"),
        ("patch", "{config}"),
        ("delete", "{config}"),
        ("get", "{config}/environment-variable"),
        ("post", "{config}/environment-variable"),
        ("patch", "environment-variable/{variable}"),
        ("delete", "environment-variable/{variable}"),
    ],
)
def test_another_organisations_config_is_404_and_unchanged(
    actor, other_org_actor, api_client_for, method, path
):
    config = new_config(actor, sandbox_type="docker", memory_mb=300)
    variable = new_variable(config)
    url = f"{ROOT}/" + path.format(config=config.id, variable=variable.id)

    response = getattr(api_client_for(other_org_actor), method)(
        url, {"config": {"memory_mb": 512}, "key": "X", "value": "y"}, format="json"
    )

    assert response.status_code == 404
    assert SandboxConfig.objects.for_actor(actor).get().memory_mb == 300
    assert SandboxEnvironmentVariable.objects.for_actor(actor).get().value == SECRET


def test_another_organisations_configs_are_not_listed(client, other_org_actor):
    new_config(other_org_actor, sandbox_type="docker")

    assert client.get(f"{ROOT}/").json() == []


def test_without_a_key_it_is_401(db):
    assert APIClient().get(f"{ROOT}/").status_code == 401
    assert APIClient().post(f"{ROOT}/local/default").status_code == 401


WRITES = [
    ("create a config", "post", "", {"config": {"memory_mb": 512}}),
    ("create a local config", "post", "local", {"memory_mb": 512}),
    ("create a default config", "post", "docker/default", None),
    ("update a config", "patch", "{config}", {"config": {"memory_mb": 512}}),
    ("delete a config", "delete", "{config}", None),
    ("add a variable", "post", "{config}/environment-variable", {"key": "NEW", "value": "x"}),
    ("change a variable", "patch", "environment-variable/{variable}", {"value": "changed"}),
    ("delete a variable", "delete", "environment-variable/{variable}", None),
]


@pytest.mark.parametrize("role", ["owner", "admin", "member"])
@pytest.mark.parametrize(("name", "method", "path", "body"), WRITES, ids=[w[0] for w in WRITES])
def test_only_owners_and_admins_write_sandbox_settings(
    role, people, api_client_for, name, method, path, body
):
    actor = people[role]
    config = new_config(actor, sandbox_type="local", memory_mb=300)
    variable = new_variable(config)
    before = (
        snapshot(actor),
        list(SandboxEnvironmentVariable.objects.for_actor(actor).values_list("key", "value")),
    )
    url = f"{ROOT}/" + path.format(config=config.id, variable=variable.id)

    response = getattr(api_client_for(actor), method)(url, body, format="json")

    after = (
        snapshot(actor),
        list(SandboxEnvironmentVariable.objects.for_actor(actor).values_list("key", "value")),
    )
    if role == "member":
        assert response.status_code == 403, response.content
        assert response.json()["detail"] == (
            "Not allowed: only owners and admins may change sandbox configurations and sandbox variables."
        )
        assert after == before
    else:
        assert response.status_code in (200, 204), response.content
        assert after != before


def test_members_read_configs_and_variable_keys(people, api_client_for):
    member = people["member"]
    config = new_config(member, sandbox_type="docker")
    new_variable(config)
    client = api_client_for(member)

    listed = client.get(f"{ROOT}/")
    variables = client.get(f"{ROOT}/{config.id}/environment-variable")

    assert [c["id"] for c in listed.json()] == [config.id]
    assert [(v["key"], v["value"]) for v in variables.json()] == [("API_TOKEN", None)]
    assert SECRET not in variables.content.decode()


# --- what a tool then sees -------------------------------------------------------------------------------

READ_TOKEN = '''def read_token() -> str:
    """Read the token."""
    import os
    return os.environ.get("API_TOKEN", "missing")
'''
SLOW = '''def slow() -> str:
    """Take long."""
    import time
    time.sleep(10)
    return "done"
'''


def test_a_tool_runs_with_the_variables_and_limits_set_through_the_api(client, settings):
    settings.SANDBOX_BACKEND = "local"  # the jail (bubblewrap); Docker applies the same config
    config = client.post(f"{ROOT}/local", {"timeout": 2}, format="json").json()
    client.post(
        f"{ROOT}/{config['id']}/environment-variable", {"key": "API_TOKEN", "value": SECRET}, format="json"
    )

    token = client.post("/v1/tools/run", {"source_code": READ_TOKEN, "args": {}}, format="json").json()
    slow = client.post("/v1/tools/run", {"source_code": SLOW, "args": {}}, format="json").json()

    assert (token["status"], token["tool_return"], token["sandbox"]) == ("success", SECRET, "local")
    assert slow["status"] == "error"
    assert "timed out after 2" in slow["tool_return"]


# --- the SDK's transport ---------------------------------------------------------------------------------


@pytest.fixture
def _no_persistent_connections_in_server_threads() -> Iterator[None]:
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    yield
    db_settings["CONN_MAX_AGE"] = saved


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_no_persistent_connections_in_server_threads")
def test_sandbox_config_through_the_letta_sdks_transport(live_server, actor):
    """letta-client 1.12.1 has no sandbox-config resource; its generic methods send what it sends
    everywhere (a JSON content type even on DELETE, Accept: application/json)."""
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk").raw_key
    sdk = Letta(base_url=live_server.url, api_key=key, max_retries=0, timeout=20)

    config: Any = sdk.post(f"{ROOT}/local/default", cast_to=object)
    variable: Any = sdk.post(
        f"{ROOT}/{config['id']}/environment-variable",
        body={"key": "API_TOKEN", "value": SECRET},
        cast_to=object,
    )
    listed: Any = sdk.get(f"{ROOT}/{config['id']}/environment-variable", cast_to=object)
    sdk.delete(f"{ROOT}/environment-variable/{variable['id']}", cast_to=type(None))

    assert config["type"] == "local"
    assert [(v["key"], v["value"]) for v in listed] == [("API_TOKEN", None)]
    assert SECRET not in json.dumps([variable, listed])
    assert not SandboxEnvironmentVariable.objects.for_actor(actor).exists()
