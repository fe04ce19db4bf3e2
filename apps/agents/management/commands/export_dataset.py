"""`manage.py export_dataset ORGANIZATION [--agent ID] [--since ISO] [--until ISO] [--feedback positive|negative]
[--limit N] [--output FILE] [--format jsonl|parquet]`: finished runs as JSONL (or Parquet) (apps.agents.trajectories), one run per line."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from apps.accounts.services import organization_lookup
from apps.agents.trajectories import EXPORT_MAX_RUNS, ExportFilter, export_runs, jsonl, write_parquet
from apps.core.actor import Actor
from apps.core.errors import DomainError


class Command(BaseCommand):
    help = (
        "Export an organisation's finished runs as a JSONL dataset: messages with a loss mask (1 for what "
        "the model produced), tool calls, per-call token ids and logprobs, and step feedback."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("organization", help="the organisation's id or name")
        parser.add_argument("--agent", help="only this agent's runs")
        parser.add_argument("--since", help="runs created at or after this ISO time")
        parser.add_argument("--until", help="runs created before this ISO time")
        parser.add_argument(
            "--feedback", choices=["positive", "negative"], help="runs with a step of this feedback"
        )
        parser.add_argument(
            "--limit", type=int, default=1000, help=f"at most this many runs (<= {EXPORT_MAX_RUNS})"
        )
        parser.add_argument("--output", help="write here instead of stdout")
        parser.add_argument(
            "--format",
            choices=["jsonl", "parquet"],
            default="jsonl",
            help="parquet (needs --output): the nested fields as JSON text columns",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            organization = organization_lookup(reference=options["organization"])
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        where = ExportFilter(
            agent_id=options.get("agent"),
            since=_when(options.get("since"), "--since"),
            until=_when(options.get("until"), "--until"),
            feedback=options.get("feedback"),
            limit=options["limit"],
        )
        rows = export_runs(actor=Actor.system(organization.id), where=where)
        if options["format"] == "parquet":
            if not options.get("output"):
                raise CommandError("--format parquet needs --output FILE")
            count = write_parquet(rows, options["output"])
            self.stderr.write(f"{count} run(s) exported")
            return
        lines = jsonl(rows)
        count = 0
        if options.get("output"):
            with open(options["output"], "w", encoding="utf-8") as out:
                for line in lines:
                    out.write(line)
                    count += 1
        else:
            for line in lines:
                sys.stdout.write(line)
                count += 1
        self.stderr.write(f"{count} run(s) exported")


def _when(value: str | None, flag: str) -> Any:
    if not value:
        return None
    parsed = parse_datetime(value)
    if parsed is None:
        raise CommandError(f"{flag}: not an ISO date-time: {value!r}")
    return parsed
