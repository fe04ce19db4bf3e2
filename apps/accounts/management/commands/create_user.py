"""`manage.py create_user USERNAME [--password P] [--email E]`: a new user, from a shell."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.accounts.services import user_create
from apps.core.errors import DomainError


class Command(BaseCommand):
    help = "Create a user (no organisation yet: see add_member). Without --password, one is generated and printed once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--password", help="the password (default: generated, printed once)")
        parser.add_argument("--email", default="", help="the user's e-mail address")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            created = user_create(
                username=options["username"], password=options["password"], email=options["email"]
            )
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"User '{created.user.username}' created ({created.user.id})")
        if created.generated_password:
            self.stdout.write(
                self.style.WARNING(f"Password (shown once, store it now): {created.generated_password}")
            )
