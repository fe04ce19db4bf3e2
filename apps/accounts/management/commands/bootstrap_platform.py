"""`manage.py bootstrap_platform`: idempotent first-run setup used by `make run` and docker-compose."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand

from apps.accounts.services import platform_bootstrap


class Command(BaseCommand):
    help = "Create the first organisation, an admin user and an API key (printed once). Safe to re-run."

    def handle(self, *args: Any, **options: Any) -> None:
        result = platform_bootstrap(
            organization_name=os.environ.get("BOOTSTRAP_ORGANIZATION", "default"),
            admin_username=os.environ.get("DJANGO_SUPERUSER_USERNAME", "admin"),
            admin_email=os.environ.get("DJANGO_SUPERUSER_EMAIL", "admin@example.com"),
            admin_password=os.environ.get("DJANGO_SUPERUSER_PASSWORD") or None,
            api_key=os.environ.get("BOOTSTRAP_API_KEY") or None,
        )
        out = self.stdout
        out.write(f"Organization: {result.organization.name} ({result.organization.id})")
        if result.generated_password:
            out.write(
                self.style.WARNING(
                    f"Admin user '{result.admin.username}' created with password (shown once): "
                    f"{result.generated_password}"
                )
            )
        elif result.created_admin:
            out.write(f"Admin user '{result.admin.username}' created with DJANGO_SUPERUSER_PASSWORD")
        if result.raw_api_key:
            out.write(self.style.WARNING(f"API key (shown once, store it now): {result.raw_api_key}"))
