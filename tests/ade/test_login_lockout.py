"""Failed sign-ins are locked out per username and address (django-axes), on the ADE's login and the admin's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.factories import MembershipFactory, UserFactory

PASSWORD = "pw-for-tests-1"  # tests.factories.UserFactory's


@pytest.fixture(autouse=True)
def _three_attempts(settings):
    settings.AXES_FAILURE_LIMIT = 3


def sign_in(client: Client, username: str, password: str, *, path: str = "/login/") -> object:
    return client.post(path, {"username": username, "password": password})


def test_the_settings_are_mapped_onto_axes():
    from config import settings as conf  # the module's values, not the tests' overrides

    assert (conf.LOGIN_FAILURE_LIMIT, conf.LOGIN_LOCKOUT_MINUTES) == (5, 15)
    assert conf.AXES_FAILURE_LIMIT == conf.LOGIN_FAILURE_LIMIT
    assert conf.AXES_COOLOFF_TIME.total_seconds() == conf.LOGIN_LOCKOUT_MINUTES * 60
    assert conf.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]
    assert conf.MIDDLEWARE[-1] == "axes.middleware.AxesMiddleware"
    assert conf.AUTHENTICATION_BACKENDS[0] == "axes.backends.AxesStandaloneBackend"


def test_the_ade_login_locks_out_after_the_limit_and_says_so(db, user):
    client = Client()

    tries = [sign_in(client, "alice", "wrong") for _ in range(2)]
    locked = sign_in(client, "alice", "wrong")
    even_right = sign_in(client, "alice", PASSWORD)

    assert [r.status_code for r in tries] == [200, 200]
    assert "Please enter a correct username and password" in tries[0].content.decode()
    assert locked.status_code == 429
    assert even_right.status_code == 429
    page = even_right.content.decode()
    assert "Too many failed sign-ins" in page
    assert "15 minutes" in page
    assert 'name="password"' in page  # still the sign-in page, readable, in the ADE's layout
    assert even_right["Retry-After"] == str(15 * 60)
    assert "_auth_user_id" not in client.session


def test_another_address_or_another_user_is_not_locked_out(db, user, org):
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(3):
        sign_in(attacker, "alice", "wrong")
    bob = MembershipFactory(organization=org, user=UserFactory(username="bob")).user

    from_elsewhere = sign_in(Client(REMOTE_ADDR="198.51.100.2"), "alice", PASSWORD)
    other_user = sign_in(attacker, bob.username, PASSWORD)

    assert (from_elsewhere.status_code, from_elsewhere["Location"]) == (302, "/")
    assert other_user.status_code == 302


def test_the_lockout_ends_after_the_cool_off(db, user):
    from axes.models import AccessAttempt

    client = Client()
    for _ in range(3):
        sign_in(client, "alice", "wrong")
    assert sign_in(client, "alice", PASSWORD).status_code == 429

    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    response = sign_in(client, "alice", PASSWORD)

    assert response.status_code == 302


def test_a_successful_sign_in_resets_the_count(db, user):
    client = Client()
    for _ in range(2):
        sign_in(client, "alice", "wrong")
    assert sign_in(client, "alice", PASSWORD).status_code == 302
    client.logout()

    after = [sign_in(client, "alice", "wrong").status_code for _ in range(2)]

    assert after == [200, 200]


def test_the_admin_login_is_locked_out_too(db):
    UserFactory(username="root", is_staff=True, is_superuser=True)
    client = Client()

    tries = [sign_in(client, "root", "wrong", path="/admin/login/").status_code for _ in range(3)]
    locked = sign_in(client, "root", PASSWORD, path="/admin/login/")

    assert tries == [200, 200, 429]
    assert locked.status_code == 429
    assert "too many" in locked.content.decode().lower()
    assert locked["Retry-After"] == str(15 * 60)


def test_force_login_of_the_test_client_is_unaffected(db, user):
    client = Client()
    for _ in range(3):
        sign_in(client, "alice", "wrong")

    client.force_login(user)

    assert client.get("/agents/").status_code == 200
