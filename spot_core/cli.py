"""`spot-pipelines` command line: one subcommand per module in ``spot_core.commands``.

Each command module offers ``register(subparsers)`` and a ``run(args) -> int``. Errors the
project raises on purpose (``SpotError``) end the process with one line on stderr and
exit code 2, never a traceback: they already say what to fix.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

from spot_core import __version__
from spot_core.errors import SpotError

COMMANDS = ("demo", "run", "simulate", "watch")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spot-pipelines",
        description="Run ML pipeline steps on spot capacity, safely.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", default="WARNING",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="logging level for diagnostics on stderr (default WARNING)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"spot_core.commands.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.handler(args) or 0)
    except SpotError as exc:
        print(f"spot-pipelines {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"spot-pipelines {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
