"""mypy (with django-stubs and the DRF stubs) over the whole tree, held to a recorded baseline.

The tree is not type-clean yet: `mypy-baseline.txt` records how many errors of each code each file has.
A file may not gain errors of any code; when it loses some, the baseline is rewritten with --update (so
it only ever shrinks, and a fixed error cannot come back unseen). Counts, not lines: line numbers move
with every edit.

Usage: scripts/check_types.py [--update]. Exit 0 when the tree matches the baseline, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "mypy-baseline.txt"
ERROR = re.compile(r"^(?P<path>[^:]+):\d+: error: .*\[(?P<code>[a-z-]+)\]$")
# config/settings.py reads these at import (the django-stubs plugin imports it); nothing connects.
SETTINGS_ENV = {
    "DJANGO_SECRET_KEY": "type-check",
    "DATABASE_URL": "postgres://type-check@127.0.0.1:1/none",
    "REDIS_URL": "redis://127.0.0.1:1/0",
}

Counts = Counter[tuple[str, str]]


def run_mypy() -> tuple[Counts, list[str]]:
    env = {**SETTINGS_ENV, **os.environ}
    done = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode not in (0, 1) or "INTERNAL ERROR" in done.stderr:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"mypy failed to run (exit {done.returncode})")
    lines = [line for line in done.stdout.splitlines() if ERROR.match(line)]
    counts: Counts = Counter()
    for line in lines:
        match = ERROR.match(line)
        assert match is not None
        counts[(match["path"], match["code"])] += 1
    return counts, lines


def read_baseline() -> Counts:
    counts: Counts = Counter()
    if BASELINE.exists():
        for line in BASELINE.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                count, path, code = line.split()
                counts[(path, code.strip("[]"))] = int(count)
    return counts


def write_baseline(counts: Counts) -> None:
    header = (
        "# mypy errors per file and code that the tree still has (scripts/check_types.py); may only shrink.\n"
    )
    body = "".join(f"{counts[key]} {key[0]} [{key[1]}]\n" for key in sorted(counts) if counts[key])
    BASELINE.write_text(header + body)


def compare(counts: Counts, baseline: Counts) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(file/code pairs with more errors than the baseline allows, pairs with fewer than it records)."""
    grown = sorted(key for key in counts if counts[key] > baseline[key])
    shrunk = sorted(key for key in baseline if counts[key] < baseline[key])
    return grown, shrunk


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="record the current counts as the baseline")
    args = parser.parse_args(argv)
    counts, lines = run_mypy()
    baseline = read_baseline()
    if args.update:
        added = sorted(key for key in counts if counts[key] > baseline[key])
        if added and baseline:
            print("refusing to record new errors in the baseline:", file=sys.stderr)
            for path, code in added:
                print(
                    f"  {path} [{code}]: {baseline[(path, code)]} -> {counts[(path, code)]}", file=sys.stderr
                )
            return 1
        write_baseline(counts)
        print(f"baseline: {sum(counts.values())} errors in {len({p for p, _ in counts})} files")
        return 0
    grown, shrunk = compare(counts, baseline)
    for path, code in grown:
        print(
            f"{path}: {counts[(path, code)]} [{code}] errors, the baseline allows {baseline[(path, code)]}:"
        )
        for line in lines:
            if line.startswith(f"{path}:") and line.endswith(f"[{code}]"):
                print(f"  {line}")
    if shrunk:
        print(
            f"{len(shrunk)} file/code pairs have fewer errors than mypy-baseline.txt records: "
            "run scripts/check_types.py --update to lock that in"
        )
    if grown or shrunk:
        return 1
    print(f"types: {sum(counts.values())} errors, as recorded in mypy-baseline.txt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
