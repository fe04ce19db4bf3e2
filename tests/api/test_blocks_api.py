import pytest
from rest_framework.test import APIClient

from apps.memory.models import Block, BlockHistory
from tests.factories import BlockFactory


def test_health_needs_no_key(db):
    response = APIClient().get("/v1/health/")

    assert response.status_code == 200
    assert response.json()["status"] == "ok"


@pytest.mark.django_db
def test_requests_without_a_key_are_401():
    response = APIClient().get("/v1/blocks/")

    assert response.status_code == 401
    assert "detail" in response.json()


@pytest.mark.django_db
def test_a_wrong_key_is_401():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer sk-let-not-a-real-key-000000")

    response = client.get("/v1/blocks/")

    assert response.status_code == 401
    assert response.json()["detail"] == "Invalid or revoked API key"


def test_block_crud_through_the_api(actor, api_client_for):
    client = api_client_for(actor)

    created = client.post(
        "/v1/blocks/", {"label": "human", "value": "Name: Sam", "limit": 100}, format="json"
    )
    block_id = created.json()["id"]
    patched = client.patch(f"/v1/blocks/{block_id}", {"value": "Name: Sam\nHikes"}, format="json")
    fetched = client.get(f"/v1/blocks/{block_id}")
    deleted = client.delete(f"/v1/blocks/{block_id}")

    assert created.status_code == 200
    assert block_id.startswith("block-")
    assert patched.json()["value"] == "Name: Sam\nHikes"
    assert fetched.json()["limit"] == 100
    assert deleted.status_code == 200
    assert not Block.objects.for_actor(actor).filter(id=block_id).exists()


def test_block_over_limit_is_a_400_with_a_message(actor, api_client_for):
    response = api_client_for(actor).post(
        "/v1/blocks/", {"label": "h", "value": "x" * 6, "limit": 5}, format="json"
    )

    assert response.status_code == 400
    assert (
        response.json()["detail"]
        == "Block 'h' value is 6 characters, over its limit of 5. Shorten the value or raise the limit."
    )


def test_malformed_body_is_a_422_naming_the_field(actor, api_client_for):
    response = api_client_for(actor).post("/v1/blocks/", {"value": "no label"}, format="json")

    assert response.status_code == 422
    assert "label" in response.json()["detail"]


def test_api_edits_are_recorded_in_history_as_the_user(actor, api_client_for):
    block = BlockFactory(organization_id=actor.organization_id, value="a")

    api_client_for(actor).patch(f"/v1/blocks/{block.id}", {"value": "b"}, format="json")

    entry = BlockHistory.objects.for_actor(actor).get(block=block)
    assert (entry.actor_type, entry.actor_id, entry.value_before, entry.value_after) == (
        "user",
        actor.user_id,
        "a",
        "b",
    )


@pytest.mark.parametrize(
    ("method", "body"),
    [("get", None), ("patch", {"value": "hacked"}), ("delete", None)],
)
def test_another_organisation_gets_404_for_a_block(actor, other_org_actor, api_client_for, method, body):
    block = BlockFactory(organization_id=actor.organization_id, value="private")

    response = getattr(api_client_for(other_org_actor), method)(f"/v1/blocks/{block.id}", body, format="json")

    assert response.status_code == 404
    assert response.json()["detail"] == f"Block with id '{block.id}' not found"
    block.refresh_from_db()
    assert block.value == "private"


def test_list_shows_only_the_callers_organisation(actor, other_org_actor, api_client_for):
    mine = BlockFactory(organization_id=actor.organization_id)
    BlockFactory(organization_id=other_org_actor.organization_id)

    response = api_client_for(actor).get("/v1/blocks/")

    assert [b["id"] for b in response.json()] == [mine.id]


def test_list_pagination_honours_after_until_an_empty_page(actor, api_client_for):
    ids = [BlockFactory(organization_id=actor.organization_id, label=f"b{i}").id for i in range(3)]
    client = api_client_for(actor)

    seen, after = [], None
    for _ in range(5):
        query = {"limit": 2, "order": "asc"} | ({"after": after} if after else {})
        page = client.get("/v1/blocks/", query).json()
        if not page:
            break
        seen += [b["id"] for b in page]
        after = page[-1]["id"]

    assert seen == ids


def test_both_slash_forms_are_served_without_redirect(actor, api_client_for):
    client = api_client_for(actor)

    assert client.get("/v1/blocks").status_code == 200
    assert client.get("/v1/blocks/").status_code == 200


def test_openapi_schema_is_served(db):
    response = APIClient().get("/openapi.json")

    assert response.status_code == 200
    assert "/v1/blocks/" in response.content.decode() or "/v1/blocks" in response.content.decode()


def test_a_cursor_of_another_organisation_reveals_nothing(actor, other_org_actor, api_client_for):
    # Before: the cursor was looked up unscoped, so another organisation's id gave a page where an
    # unknown id gave none, which told whether that id exists.
    theirs = BlockFactory(organization_id=other_org_actor.organization_id, label="secret")
    for i in range(3):  # newer than theirs: an unscoped cursor would page on to them
        BlockFactory(organization_id=actor.organization_id, label=f"b{i}")
    client = api_client_for(actor)

    with_their_cursor = client.get("/v1/blocks/", {"after": theirs.id, "order": "asc"})
    with_unknown_cursor = client.get(
        "/v1/blocks/", {"after": "block-00000000-0000-4000-8000-000000000000", "order": "asc"}
    )

    assert with_their_cursor.status_code == with_unknown_cursor.status_code == 200
    assert with_their_cursor.json() == with_unknown_cursor.json() == []
