"""`manage.py backup_database PATH [--pg-bin DIR]`: a pg_dump of the platform's database (README "Backups")."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core.backup import backup
from apps.core.errors import DomainError


class Command(BaseCommand):
    help = (
        "Write a backup of the platform's database to PATH (pg_dump, custom format, mode 0600): one "
        "consistent snapshot, safe to take while the platform serves. Keep SECRETS_ENCRYPTION_KEY (with "
        "`make run`: DATA_DIR/secrets.env) with it: stored secrets cannot be read without it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", type=Path, help="the file to write (replaced if it exists)")
        parser.add_argument(
            "--pg-bin", type=Path, help="folder of the pg_dump to use (default: the embedded one)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["path"]
        try:
            size = backup(path, bin_dir=options["pg_bin"])
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        except subprocess.CalledProcessError as exc:
            raise CommandError(f"pg_dump failed (exit {exc.returncode}); see its message above.") from exc
        self.stdout.write(f"Backup written to {path} ({size:,} bytes)")
