"""`manage.py add_member ORGANIZATION USERNAME --role owner|admin|member`: membership, from a shell."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.accounts.services import membership_grant, organization_lookup, user_lookup
from apps.core.errors import DomainError


class Command(BaseCommand):
    help = "Add a user to an organisation with a role; for an existing member, change the role."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("organization", help="the organisation's id or name")
        parser.add_argument("username")
        parser.add_argument("--role", required=True, help="owner, admin or member")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            organization = organization_lookup(reference=options["organization"])
            user = user_lookup(username=options["username"])
            change = membership_grant(organization=organization, user=user, role=options["role"])
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        role, who = change.membership.role, f"'{user.username}'"
        if change.previous_role is None:
            message = f"Added {who} to '{organization.name}' as {role}"
        elif change.previous_role != role:
            message = f"{who} was already a member of '{organization.name}': role changed from {change.previous_role} to {role}"
        else:
            message = f"{who} is already {role} of '{organization.name}': nothing changed"
        self.stdout.write(message)
