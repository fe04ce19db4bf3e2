"""The ADE authenticates with the Django session; the API honours it, scoped to the user's organisation."""

from rest_framework.test import APIClient

from tests.factories import BlockFactory


def test_a_logged_in_user_reads_their_organisations_blocks(user, org, other_org):
    mine = BlockFactory(organization=org)
    BlockFactory(organization=other_org)
    client = APIClient()
    client.force_login(user)

    response = client.get("/v1/blocks/")

    assert response.status_code == 200
    assert [b["id"] for b in response.json()] == [mine.id]


def test_session_writes_need_a_csrf_token(user):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)

    response = client.post("/v1/blocks/", {"label": "human", "value": "x"}, format="json")

    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
