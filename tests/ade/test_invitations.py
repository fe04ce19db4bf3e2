"""Owners invite people by a single-use link; whoever opens it joins with the invitation's role.

Through the ADE's pages: the members settings (create, list, revoke) and the accept page
(`/invite/<token>/`) for signed-in users and for visitors who create an account there.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from apps.accounts.models import Invitation, Membership, User
from apps.accounts.services import invitation_accept, invitation_create
from apps.core.actor import Actor, Role
from tests.factories import UserFactory

HTMX = {"HTTP_HX_REQUEST": "true"}
PASSWORD = "a-long-passphrase-42"


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def invite(owner_client: Client, role: str = "member", note: str = "") -> str:
    """Create an invitation on the members page; returns the link it shows."""
    response = owner_client.post("/settings/members/invitations/", {"role": role, "note": note}, **HTMX)
    assert response.status_code == 200
    return response.content.decode().split('data-testid="new-invitation-link">', 1)[1].split("<", 1)[0]


def path_of(link: str) -> str:
    return link.removeprefix("http://testserver")


def main_of(response) -> str:
    """The page's content, without the per-request parts around it (CSRF token, top bar)."""
    body = response.content.decode()
    return body[body.index("<main") : body.index("</main>")]


def members_of(org) -> dict[str, str]:
    return dict(Membership.objects.filter(organization=org).values_list("user__username", "role"))


# --- creating, listing, revoking ------------------------------------------------------------------------


def test_an_owner_gets_the_link_once_and_only_its_hash_is_stored(owner_client, actor):
    response = owner_client.post("/settings/members/invitations/", {"role": "admin", "note": "Sam"}, **HTMX)

    body = response.content.decode()
    link = body.split('data-testid="new-invitation-link">', 1)[1].split("<", 1)[0]
    token = path_of(link).removeprefix("/invite/").removesuffix("/")
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    assert link.startswith("http://testserver/invite/")
    assert len(token) >= 40
    assert "it will not be shown again" in body
    invitation = Invitation.objects.for_actor(actor).get()
    assert invitation.token_hash == hashlib.sha256(token.encode()).hexdigest()
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM accounts_invitation")
        (row,) = cursor.fetchall()
    assert not any(token in str(value) for value in row)
    # Later the page lists the invitation as pending, without its link.
    later = owner_client.get("/settings/members/").content.decode()
    assert token not in later
    assert f'data-invitation="{invitation.id}"' in later
    assert "Sam" in later


def test_an_invitation_needs_a_real_role(owner_client, actor):
    response = owner_client.post("/settings/members/invitations/", {"role": "superuser"}, **HTMX)

    assert response.status_code == 422
    assert "Choose a role" in response.content.decode()
    assert not Invitation.objects.for_actor(actor).exists()


@pytest.mark.parametrize("role", [Role.ADMIN, Role.MEMBER])
def test_admins_and_members_cannot_invite(org, actor, make_user, role):
    client = signed_in(make_user(org, role=role))
    invitation_create(actor=actor, role="member", note="pending one")

    page = client.get("/settings/members/").content.decode()
    response = client.post("/settings/members/invitations/", {"role": "owner"}, **HTMX)
    full_page = client.post("/settings/members/invitations/", {"role": "owner"})

    assert "Invite a member" not in page
    assert "pending one" not in page
    assert response.status_code == 403
    assert "only owners may invite" in response.content.decode()
    assert full_page.status_code == 403
    assert "only owners may invite" in full_page.content.decode()
    assert Invitation.objects.for_actor(actor).count() == 1


def test_revoking_an_invitation_stops_its_link(owner_client, actor, other_user):
    link = invite(owner_client, note="Bob")
    invitation = Invitation.objects.for_actor(actor).get()

    response = owner_client.post(f"/settings/members/invitations/{invitation.id}/revoke/", **HTMX)
    opened = signed_in(other_user).get(path_of(link))

    body = response.content.decode()
    assert response.status_code == 200
    assert "Invitation for Bob revoked: its link no longer works." in body
    assert f'data-invitation="{invitation.id}"' not in body
    assert opened.status_code == 404
    assert "This invitation is not valid" in opened.content.decode()


def test_another_organisations_invitation_cannot_be_revoked(owner_client, other_org_actor):
    theirs = invitation_create(actor=other_org_actor, role="member").invitation

    response = owner_client.post(f"/settings/members/invitations/{theirs.id}/revoke/", **HTMX)

    assert response.status_code == 404
    assert Invitation.objects.for_actor(other_org_actor).get().revoked_at is None


def test_the_members_page_never_says_whether_a_username_exists(owner_client, actor, other_user):
    page = owner_client.get("/settings/members/").content.decode()
    old_form = [
        owner_client.post("/settings/members/", {"username": name, "role": "member"}, **HTMX)
        for name in ("bob", "nobody")
    ]
    answers = []
    for name in ("bob", "nobody"):  # an existing user's name and an unknown one, as the note
        response = owner_client.post(
            "/settings/members/invitations/", {"role": "member", "note": name}, **HTMX
        )
        answers.append(scrubbed(response.content.decode(), name))
        invitation = Invitation.objects.for_actor(actor).get(note=name)
        owner_client.post(f"/settings/members/invitations/{invitation.id}/revoke/", **HTMX)

    assert 'name="username"' not in page
    assert [r.status_code for r in old_form] == [405, 405]
    assert old_form[0].content == old_form[1].content
    assert not Membership.objects.filter(user=other_user, organization_id=actor.organization_id).exists()
    assert answers[0] == answers[1]  # the note is only a label: the page is the same either way
    assert "There is no user" not in answers[1]


def scrubbed(body: str, note: str) -> str:
    """A panel without what differs between two invitations anyway: CSRF token, link, id, times, note."""
    body = re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "CSRF", body)
    body = re.sub(r'data-testid="new-invitation-link">[^<]*', "LINK", body)
    body = re.sub(r"invitation-[0-9a-f-]{36}", "ID", body)
    body = re.sub(r"until [^.]*\.|title=\"[^\"]*\"|in [0-9][^<]*", "TIME", body)
    return body.replace(note, "NOTE")


# --- accepting, signed in --------------------------------------------------------------------------------


def test_a_signed_in_user_sees_the_organisation_and_role_then_joins(owner_client, org, other_user):
    link = invite(owner_client, role="admin")
    bob = signed_in(other_user)

    page = bob.get(path_of(link))
    accepted = bob.post(path_of(link), follow=True)

    body = page.content.decode()
    assert page.status_code == 200
    assert 'data-testid="invitation-organization">Acme<' in body
    assert 'data-testid="invitation-role">admin<' in body
    assert 'data-testid="accept"' in body
    assert accepted.redirect_chain == [("/agents/", 302)]
    landed = accepted.content.decode()
    assert "You joined Acme as admin." in landed
    assert f'<option value="{org.id}" selected>Acme (admin)</option>' in landed  # acting for Acme now
    assert members_of(org) == {"alice": Role.OWNER, "bob": Role.ADMIN}
    assert 'data-member="bob"' in owner_client.get("/settings/members/").content.decode()
    assert "No pending invitations." in owner_client.get("/settings/members/").content.decode()


def test_someone_in_no_organisation_yet_can_accept(owner_client, org):
    loner = UserFactory(username="lonely")
    client = signed_in(loner)
    assert "No organization" in client.get("/agents/").content.decode()  # nowhere to go before

    response = client.post(path_of(invite(owner_client)), follow=True)

    assert response.redirect_chain == [("/agents/", 302)]
    assert "You joined Acme as member." in response.content.decode()
    assert members_of(org)["lonely"] == Role.MEMBER


def test_a_member_already_is_told_so_and_the_invitation_stays_usable(owner_client, org, make_user):
    mia = make_user(org, role=Role.MEMBER, username="mia")
    link = invite(owner_client, role="owner")
    client = signed_in(mia)

    page = client.get(path_of(link)).content.decode()
    posted = client.post(path_of(link))

    assert "You are already a member of Acme." in page
    assert 'data-testid="accept"' not in page
    assert posted.status_code == 409
    assert "You are already a member of Acme." in posted.content.decode()
    assert members_of(org)["mia"] == Role.MEMBER
    assert 'data-testid="accept"' in signed_in(UserFactory()).get(path_of(link)).content.decode()


def test_an_invitation_works_once(owner_client, org, other_user):
    link = invite(owner_client)
    signed_in(other_user).post(path_of(link))
    carol = signed_in(UserFactory(username="carol"))

    page = carol.get(path_of(link))
    posted = carol.post(path_of(link))

    assert page.status_code == posted.status_code == 404
    assert "This invitation is not valid" in posted.content.decode()
    assert set(members_of(org)) == {"alice", "bob"}


# --- accepting as a visitor ------------------------------------------------------------------------------


def test_a_visitor_creates_an_account_and_joins_in_one_step(owner_client, org):
    client = Client()  # a visitor: not signed in
    link = invite(owner_client, role="admin")

    page = client.get(path_of(link)).content.decode()
    response = client.post(path_of(link), {"username": "newbie", "password": PASSWORD}, follow=True)

    assert 'data-testid="signup-form"' in page
    assert "Acme" in page
    assert response.redirect_chain == [("/agents/", 302)]
    assert "You joined Acme as admin." in response.content.decode()
    assert members_of(org)["newbie"] == Role.ADMIN
    assert PASSWORD not in response.content.decode()
    # The account is a real one: it signs in on the sign-in page with its password.
    again = Client()
    signed = again.post("/login/", {"username": "newbie", "password": PASSWORD})
    assert signed.status_code == 302
    assert "Acme (admin)" in again.get("/agents/").content.decode()


def test_a_visitor_with_an_account_signs_in_and_comes_back_to_accept(owner_client, org, other_user):
    client = Client()  # a visitor: not signed in
    path = path_of(invite(owner_client))

    page = client.get(path).content.decode()
    login_url = page.split('data-testid="login-link"', 1)[0].rsplit('href="', 1)[1].split('"', 1)[0]
    signed_in_response = client.post(
        "/login/", {"username": "bob", "password": "pw-for-tests-1", "next": path}
    )
    accepted = client.post(path)

    assert login_url == f"/login/?next={path}"
    assert signed_in_response.status_code == 302
    assert signed_in_response["Location"] == path
    assert accepted.status_code == 302
    assert members_of(org)["bob"] == Role.MEMBER


@pytest.mark.parametrize(
    ("username", "password", "message"),
    [
        ("bob", PASSWORD, "That username is taken: choose another username."),
        ("newbie", "123", "This password is too short"),
        ("newbie", "password123", "This password is too common"),
        ("no spaces", PASSWORD, "Enter a valid username"),
    ],
)
def test_a_refused_account_says_why_and_the_link_still_works(
    owner_client, org, other_user, username, password, message
):
    client = Client()  # a visitor: not signed in
    path = path_of(invite(owner_client))

    response = client.post(path, {"username": username, "password": password})
    retry = client.post(path, {"username": "second-try", "password": PASSWORD})

    assert response.status_code == 422
    assert message in response.content.decode()
    # The password is never echoed back; the random CSRF token may contain any short string.
    page_without_tokens = re.sub(
        r'value="[A-Za-z0-9]{64}"|"X-CSRFToken": "[A-Za-z0-9]{64}"', "", response.content.decode()
    )
    assert password not in page_without_tokens
    assert not User.objects.filter(username="newbie").exists()
    assert retry.status_code == 302
    assert set(members_of(org)) == {"alice", "second-try"}


# --- links that cannot be used ---------------------------------------------------------------------------


def _expired(actor: Actor) -> str:
    created = invitation_create(actor=actor, role="member")
    Invitation.objects.for_actor(actor).filter(id=created.invitation.id).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    return created.raw_token


def _revoked(actor: Actor) -> str:
    from apps.accounts.services import invitation_revoke

    created = invitation_create(actor=actor, role="member")
    invitation_revoke(actor=actor, invitation_id=created.invitation.id)
    return created.raw_token


def _used(actor: Actor) -> str:
    created = invitation_create(actor=actor, role="member")
    invitation_accept(user=UserFactory(), raw_token=created.raw_token)
    return created.raw_token


@pytest.mark.parametrize("make_token", [_expired, _revoked, _used], ids=["expired", "revoked", "used"])
def test_expired_revoked_and_used_links_look_like_unknown_ones(actor, org, client, make_token):
    token = make_token(actor)
    members_before = members_of(org)
    unknown = client.get("/invite/not-a-real-token-at-all/")

    answers = {
        "visitor sees": client.get(f"/invite/{token}/"),
        "visitor signs up": client.post(f"/invite/{token}/", {"username": "eve", "password": PASSWORD}),
        "user sees": signed_in(UserFactory()).get(f"/invite/{token}/"),
        "user accepts": signed_in(UserFactory()).post(f"/invite/{token}/"),
    }

    assert unknown.status_code == 404
    assert "This invitation is not valid" in unknown.content.decode()
    for what, response in answers.items():
        assert (what, response.status_code, main_of(response)) == (what, 404, main_of(unknown))
    assert "Acme" not in main_of(unknown)
    assert not User.objects.filter(username="eve").exists()
    assert members_of(org) == members_before


def _backends_waiting_for_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_of_two_people_accepting_at_once_only_one_joins(org, user):
    actor = Actor(organization_id=org.id, user_id=user.id, role=Role.OWNER)
    token = invitation_create(actor=actor, role="member").raw_token
    first = UserFactory(username="first")
    second = signed_in(UserFactory(username="second"))
    holding, release = threading.Event(), threading.Event()
    answers: dict[str, object] = {}

    def accept_and_hold() -> None:
        try:
            with transaction.atomic():  # joins, and keeps its transaction open until told to commit
                invitation_accept(user=first, raw_token=token)
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    def open_link() -> None:
        try:
            answers["second"] = second.post(f"/invite/{token}/")
        finally:
            connection.close()

    threads = [threading.Thread(target=accept_and_hold), threading.Thread(target=open_link)]
    threads[0].start()
    assert holding.wait(10)
    threads[1].start()
    deadline = time.monotonic() + 10
    while not _backends_waiting_for_a_lock() and time.monotonic() < deadline:
        time.sleep(0.01)  # until the second acceptance is inside, waiting for the first one's locks
    waited = _backends_waiting_for_a_lock() > 0
    release.set()
    for thread in threads:
        thread.join(10)

    assert waited
    response = answers["second"]
    assert response.status_code == 404
    assert "This invitation is not valid" in response.content.decode()
    assert set(members_of(org)) == {"alice", "first"}
