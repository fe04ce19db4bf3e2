"""`manage.py create_organization NAME [--owner USERNAME]`: a new organisation, from a shell."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.accounts.services import organization_provision
from apps.core.errors import DomainError


class Command(BaseCommand):
    help = "Create an organisation, with an existing user as its owner when --owner is given."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the new organisation's name (unique)")
        parser.add_argument("--owner", metavar="USERNAME", help="an existing user to make its owner")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            organization = organization_provision(name=options["name"], owner_username=options["owner"])
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        owner = f", owner {options['owner']}" if options["owner"] else ""
        self.stdout.write(f"Organization '{organization.name}' created ({organization.id}{owner})")
