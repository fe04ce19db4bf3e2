"""`manage.py eval DATASET AGENT [--json]`: replay a dataset's user turns against an agent and report which
tool calls and answers match (apps.agents.trajectories.replay). Exits 1 when any case does not match."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.agents.models import Agent
from apps.agents.trajectories import dataset_cases, replay
from apps.core.actor import Actor


class Command(BaseCommand):
    help = (
        "Send each user turn of a JSONL dataset (export_dataset's format, or any rows with OpenAI chat "
        "`messages`) to AGENT, through the real run path, and compare the tools it calls and its answer."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("dataset", help="a JSONL file")
        parser.add_argument("agent", help="the agent's id")
        parser.add_argument("--json", action="store_true", help="one JSON object per case instead of text")

    def handle(self, *args: Any, **options: Any) -> None:
        agent = Agent.all_objects.filter(id=options["agent"]).only("id", "organization_id").first()
        if agent is None:
            raise CommandError(f"Agent with id '{options['agent']}' not found")
        try:
            with open(options["dataset"], encoding="utf-8") as dataset:
                cases = list(dataset_cases(dataset))
        except (OSError, ValueError) as exc:
            raise CommandError(f"{options['dataset']}: {exc}") from exc
        actor = Actor.system(agent.organization_id)
        passed = failed = 0
        for result in replay(actor=actor, agent_id=agent.id, cases=cases):
            passed, failed = (passed + 1, failed) if result.passed else (passed, failed + 1)
            if options["json"]:
                self.stdout.write(
                    json.dumps(
                        {
                            "run_id": result.run_id,
                            "user": result.user,
                            "passed": result.passed,
                            "tools_match": result.tools_match,
                            "answer_match": result.answer_match,
                            "expected_tools": result.expected_tools,
                            "got_tools": result.got_tools,
                            "expected_answer": result.expected_answer,
                            "got_answer": result.got_answer,
                            "errors": result.errors,
                        }
                    )
                )
                continue
            verdict = "MATCH" if result.passed else "MISMATCH"
            self.stdout.write(f"{verdict} {result.run_id}: {result.user[:60]!r}")
            if not result.tools_match:
                self.stdout.write(f"  tools: expected {result.expected_tools}, got {result.got_tools}")
            if not result.answer_match:
                self.stdout.write(f"  answer: expected {result.expected_answer!r}, got {result.got_answer!r}")
            for error in result.errors:
                self.stdout.write(f"  error: {error}")
        self.stdout.write(f"{passed} matched, {failed} did not, of {passed + failed}")
        if failed:
            raise SystemExit(1)
