"""`manage.py sandbox_runner [--bind HOST:PORT | --bind unix:/path]`: serve the sandbox runner
(apps/sandbox/runner_service.py), on TCP or on a Unix socket.

It needs no database or Redis: no system checks, and nothing here opens a connection.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.sandbox import runner_service


class Command(BaseCommand):
    help = "Serve the sandbox runner: the one process that talks to the Docker engine for tool calls."
    requires_system_checks: list[str] = []  # the checks would need the database

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--bind",
            default=None,
            help="HOST:PORT, or unix:/path/to/runner.sock, to listen on (default: SANDBOX_RUNNER_BIND)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            config = runner_service.RunnerConfig.from_settings()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        bind = options["bind"] or settings.SANDBOX_RUNNER_BIND
        try:
            server = runner_service.make_server(bind, config, socket_gid=settings.SANDBOX_RUNNER_SOCKET_GID)
        except (ValueError, OSError) as exc:
            raise CommandError(f"cannot listen on {bind!r}: {exc}") from None
        self.stdout.write(
            f"sandbox runner on {runner_service.listening_on(server)}: base image {config.base_image}, at most "
            f"{config.max_memory_mb} MB, {config.max_cpus:g} CPUs, {config.max_pids} pids, "
            f"{config.max_timeout:g} s per call"
        )
        self.stdout.flush()
        runner_service.serve(server)
