"""Settings in a real browser: an API key is shown once, a provider is listed without its key,
members join by invitation and their roles are changed without reloading the page."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from apps.accounts.models import ApiKey, Membership
from apps.core.actor import Role
from apps.llm.models import Provider
from tests.ade.browser.conftest import Ade, htmx_settled

SECRET = "sk-ant-browser-secret-0123456789"


def test_a_new_api_key_is_shown_once(ade: Ade, screenshot) -> None:
    page = ade.page
    page.goto(ade.url("/settings/api-keys/"))
    expect(page.get_by_text("No API keys yet.")).to_be_visible()

    page.get_by_label("Name").fill("CI pipeline")
    page.get_by_role("button", name="Create key").click()

    shown = page.get_by_test_id("new-api-key")
    expect(shown).to_have_text(re.compile(r"^sk-let-\S{30,}$"))
    raw = shown.inner_text()
    assert ApiKey.objects.for_actor(ade.actor).get(name="CI pipeline").prefix == raw[:12]
    expect(page.get_by_text("Copy it now: it will not be shown again.")).to_be_visible()
    expect(page.get_by_test_id("api-keys-table")).to_contain_text("CI pipeline")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=ade.url(""))
    page.get_by_test_id("copy-key").click()
    expect(page.get_by_test_id("copy-key")).to_have_text("Copied ✓")
    assert page.evaluate("navigator.clipboard.readText()") == raw
    screenshot(page, "settings-api-key-created")

    page.reload()
    expect(page.get_by_test_id("api-keys-table")).to_contain_text("CI pipeline")
    expect(page.get_by_test_id("new-api-key")).to_have_count(0)
    assert raw not in page.content()

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Revoke").click()
    expect(page.get_by_test_id("api-keys-table")).to_contain_text("revoked")
    screenshot(page, "settings-api-keys")


def test_a_provider_is_listed_without_its_key(ade: Ade, screenshot) -> None:
    page = ade.page
    page.goto(ade.url("/settings/providers/"))
    expect(page.get_by_text("This organization has no providers of its own yet.")).to_be_visible()

    form = page.get_by_test_id("provider-form")
    form.get_by_label("Type").select_option("anthropic")
    expect(form.get_by_label("Name")).to_have_value("anthropic")  # the type's natural handle prefix
    form.get_by_role("button", name="Add provider").click()  # without the key it needs
    expect(page.get_by_test_id("form-error")).to_have_text("Anthropic providers need an API key.")

    form = page.get_by_test_id("provider-form")
    form.get_by_label("Type").select_option("anthropic")
    form.get_by_label("API key").fill(SECRET)
    form.get_by_role("button", name="Add provider").click()

    row = page.locator("tr[data-provider=anthropic]")
    expect(row).to_contain_text("Anthropic")
    expect(row.get_by_test_id("key-set")).to_have_text("set")
    expect(page.get_by_test_id("notice")).to_contain_text("anthropic/<model>")
    assert SECRET not in page.content()
    assert page.get_by_test_id("provider-form").get_by_label("API key").input_value() == ""
    assert Provider.objects.for_actor(ade.actor).get(name="anthropic").api_key == SECRET
    screenshot(page, "settings-providers")

    page.reload()
    expect(page.locator("tr[data-provider=anthropic]")).to_be_visible()
    assert SECRET not in page.content()


def test_a_member_joins_by_invitation_and_their_role_is_changed_in_place(
    ade: Ade, new_page, screenshot
) -> None:
    page = ade.page
    page.goto(ade.url("/settings/members/"))
    form = page.get_by_test_id("invitation-form")
    form.get_by_label("Note").fill("a new colleague")
    form.get_by_role("button", name="Create invitation link").click()
    link = page.get_by_test_id("new-invitation-link")
    expect(link).to_contain_text("/invite/")
    expect(page.get_by_test_id("invitations-table")).to_contain_text("a new colleague")

    invitee = new_page()  # another browser, signed in as nobody
    invitee.goto(link.inner_text())
    expect(invitee.get_by_test_id("invitation-organization")).to_have_text(ade.org.name)
    signup = invitee.get_by_test_id("signup-form")
    signup.get_by_label("Username").fill("new-colleague")
    signup.get_by_label("Password").fill("a-long-passphrase-42")
    signup.get_by_role("button", name="Create account and join").click()
    expect(invitee).to_have_url(re.compile(r"/agents/$"))
    assert Membership.objects.get(user__username="new-colleague", organization=ade.org).role == Role.MEMBER

    page.reload()
    row = page.locator("tr[data-member=new-colleague]")
    htmx_settled(page)
    row.get_by_test_id("role-select").select_option("admin")
    expect(page.get_by_test_id("notice")).to_have_text("new-colleague is now admin.")
    htmx_settled(page)  # the panel was re-rendered: its selects are live once htmx has bound them
    assert Membership.objects.get(user__username="new-colleague", organization=ade.org).role == Role.ADMIN

    own = page.locator(f"tr[data-member='{ade.user.username}']").get_by_test_id("role-select")
    own.select_option("member")
    expect(page.get_by_test_id("form-error")).to_contain_text("is the last owner of this organization")
    expect(
        page.locator(f"tr[data-member='{ade.user.username}']").get_by_test_id("role-select")
    ).to_have_value("owner")
    screenshot(page, "settings-members")
