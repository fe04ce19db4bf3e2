"""Every ADE page declares the HTTP methods it answers (require_GET, require_POST, or GET and POST for a
form page): anything else is a 405 before the view runs, never a page or an action."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import URLPattern, reverse

from apps.ade import urls as ade_urls

SAMPLE = {
    "int": 1,
    "string": "x-1",
    "str": "x-1",
    "slug": "x-1",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "path": "x",
}


def ade_paths() -> list[tuple[str, bool]]:
    """(path, whether Django's class-based view answers it) for every ADE pattern, with sample ids."""
    paths = []
    for pattern in ade_urls.urlpatterns:
        assert isinstance(pattern, URLPattern)
        converters = pattern.pattern.converters
        kwargs = {
            name: SAMPLE[type(c).__name__.removesuffix("Converter").lower()] for name, c in converters.items()
        }
        paths.append((reverse(f"ade:{pattern.name}", kwargs=kwargs), hasattr(pattern.callback, "view_class")))
    return paths


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "class_based"), ade_paths())
def test_every_ade_page_refuses_a_method_it_does_not_answer(owner_client, path, class_based):
    """Signed in or not: the method is checked first (Django's login view redirects a signed-in user
    before it looks at the method, so it is asked anonymously only)."""
    clients = [Client()] if class_based else [Client(), owner_client]

    responses = [client.generic("PUT", path, "") for client in clients]

    assert [response.status_code for response in responses] == [405] * len(clients), path
    for response in responses:
        assert set(response["Allow"].replace(" ", "").split(",")) <= {"GET", "POST", "HEAD", "OPTIONS"}
