"""``python -m grading COMMAND``: the teacher's tools. Run with ``--help`` for the list."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grading import starters

REPO_ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grading", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("starters", help="regenerate every labs/*/starter.py from its solution.py")
    gen.add_argument("--check", action="store_true",
                     help="change nothing; exit 1 if a starter is out of date")
    args = parser.parse_args(argv)

    if args.command == "starters":
        stale = starters.regenerate(REPO_ROOT / "labs", check_only=args.check)
        for path in stale:
            print(("out of date: " if args.check else "rewrote ") + str(path.relative_to(REPO_ROOT)))
        if not stale:
            print("every starter.py matches its solution.py")
        return 1 if (args.check and stale) else 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
