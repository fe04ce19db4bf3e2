"""Project-wide guarantees: migrations match the models, the code is lint-clean, the apps keep their
import layers, and the type baseline only shrinks."""

import io
import subprocess
import sys
from collections import Counter
from pathlib import Path

from django.core.management import call_command

ROOT = Path(__file__).resolve().parent.parent


def test_every_model_change_has_a_migration(db):
    out = io.StringIO()

    call_command("makemigrations", "--check", "--dry-run", stdout=out)

    assert "No changes detected" in out.getvalue()


def test_ruff_is_clean():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True
    )

    assert result.returncode == 0, result.stdout


def test_the_apps_keep_their_import_layers():
    """pyproject.toml's import contracts: each app imports only the layers below it, and the adapters only the
    other apps' public surface (make check runs them too)."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT, capture_output=True, text=True
    )

    assert result.returncode == 0, result.stdout
    assert "Contracts: 2 kept, 0 broken." in result.stdout


def test_the_type_baseline_refuses_a_new_error_and_asks_to_record_a_fixed_one():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from check_types import compare
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    baseline = Counter({("apps/a.py", "arg-type"): 2, ("apps/b.py", "attr-defined"): 1})

    same = compare(Counter(baseline), baseline)
    new = compare(baseline + Counter({("apps/c.py", "arg-type"): 1}), baseline)
    fixed = compare(Counter({("apps/a.py", "arg-type"): 1, ("apps/b.py", "attr-defined"): 1}), baseline)

    assert same == ([], [])
    assert new == ([("apps/c.py", "arg-type")], [])
    assert fixed == ([], [("apps/a.py", "arg-type")])
