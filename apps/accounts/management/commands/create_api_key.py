"""`manage.py create_api_key ORGANIZATION USERNAME [--name N]`: prints the new key alone, on its last line."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.accounts.services import api_key_provision, organization_lookup, user_lookup
from apps.core.errors import DomainError


class Command(BaseCommand):
    help = (
        "Create an API key for a member of an organisation. The key is printed once, alone on the last "
        "line of the output (the rest goes to stderr), so scripts can capture it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("organization", help="the organisation's id or name")
        parser.add_argument("username", help="a member of that organisation")
        parser.add_argument("--name", default="cli", help="a label for the key (default: cli)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            organization = organization_lookup(reference=options["organization"])
            user = user_lookup(username=options["username"])
            created = api_key_provision(organization=organization, user=user, name=options["name"])
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        self.stderr.write(
            f"API key '{created.api_key.name}' ({created.api_key.id}) for '{user.username}' in "
            f"'{organization.name}' (shown once, store it now):"
        )
        self.stdout.write(created.raw_key)
