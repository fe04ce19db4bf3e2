#!/usr/bin/env python
import os
import sys
from pathlib import Path


def main() -> None:
    if not os.environ.get("DATABASE_URL"):
        # No external database configured: run the command against the embedded services, as
        # `make run` does (scripts/devenv.py starts them and exports their URLs and local keys).
        devenv = Path(__file__).resolve().parent / "scripts" / "devenv.py"
        os.execv(sys.executable, [sys.executable, str(devenv), "manage", *sys.argv[1:]])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
