"""`manage.py restore_database PATH [--pg-bin DIR]`: a backup_database file into an empty database."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core.backup import restore
from apps.core.errors import DomainError


class Command(BaseCommand):
    help = (
        "Restore a backup made by backup_database into the platform's database, which must be empty (a new "
        "database, or a fresh DATA_DIR): everything in one transaction, or nothing. Then run `migrate` "
        "(a backup of an older release is upgraded like any database), and start the platform with the "
        "same SECRETS_ENCRYPTION_KEY as the one backed up."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", type=Path, help="a file written by backup_database")
        parser.add_argument(
            "--pg-bin", type=Path, help="folder of the pg_restore to use (default: the embedded one)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["path"]
        try:
            restore(path, bin_dir=options["pg_bin"])
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        except subprocess.CalledProcessError as exc:
            raise CommandError(
                f"pg_restore failed (exit {exc.returncode}); nothing was restored. See its message above."
            ) from exc
        self.stdout.write(f"Restored {path}")
