"""Fixtures of the ADE's view tests."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.accounts.models import User


@pytest.fixture
def owner_client(client: Client, user: User) -> Client:
    """Django's test client, signed in as `user`, an owner of `org`."""
    client.force_login(user)
    return client
