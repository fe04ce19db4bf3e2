"""The project-wide templates (templates/): error pages in the ADE's style and the admin's branding."""

from __future__ import annotations

import pytest
from django.template.loader import render_to_string
from django.test import Client

pytestmark = pytest.mark.django_db


def test_a_missing_agent_is_a_404_page_in_the_ades_style(owner_client: Client) -> None:
    response = owner_client.get("/agents/agent-00000000-0000-4000-8000-000000000000/")

    page = response.content.decode()
    assert response.status_code == 404
    assert 'data-testid="error-404"' in page
    assert "ade/ade.css" in page
    assert 'href="/"' in page  # a way back


def test_an_unknown_page_is_the_same_404_page(owner_client: Client) -> None:
    response = owner_client.get("/no/such/page/")

    assert response.status_code == 404
    assert 'data-testid="error-404"' in response.content.decode()


@pytest.mark.parametrize("code", ["400", "403", "500"])
def test_the_other_error_pages_render_without_a_request(code: str) -> None:
    """Django renders 500.html with no context at all (the error may be in the context processors)."""
    page = render_to_string(f"{code}.html")

    assert f'data-testid="error-{code}"' in page
    assert "ade/ade.css" in page


def test_the_api_keeps_answering_json_for_unknown_paths(owner_client: Client) -> None:
    response = owner_client.get("/v1/no-such-thing")

    assert response.status_code == 404
    assert response.json() == {"detail": "Not Found"}


def test_the_admin_carries_the_platforms_name(client: Client, user) -> None:
    user.is_staff = user.is_superuser = True
    user.save()
    client.force_login(user)

    page = client.get("/admin/").content.decode()

    assert "Letta platform administration" in page
    assert "Django administration" not in page
