"""`spot-pipelines` command line: one subcommand per module in ``spot_core.commands``.

Each command module offers ``register(subparsers)`` and a ``run(args) -> int``. Errors the
project raises on purpose (``SpotError``) end the process with one line on stderr and
exit code 2, never a traceback: they already say what to fix. So does an optional
dependency the command needs and this install lacks: the line names its extra.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from spot_core import __version__
from spot_core.adaptors import extras
from spot_core.errors import SpotError

COMMANDS = ("classify-pod", "demo", "providers", "report", "run", "simulate", "watch")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag (exit 2), not a usage block,
    with a "did you mean" for a mistyped flag or command; no abbreviations (a typo such as
    ``--max-preemption 2`` is an error, never silently another flag). Subcommand parsers
    inherit it (``add_subparsers`` builds them with this class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        hint = did_you_mean(message, _option_strings(self))
        self.exit(2, f"{self.prog}: error: {message}{hint} (see {self.prog} --help)\n")


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every flag of ``parser`` and of its subcommands: argparse reports a subcommand's
    unknown flag from the top parser, which does not know the subcommand's own."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _option_strings(sub)
    return found


_INVALID_CHOICE = re.compile(r"invalid choice: '?([^'\s]*)'? \(choose from (.*)\)")
_UNRECOGNIZED = "unrecognized arguments: "


def did_you_mean(message: str, flags: set[str]) -> str:
    """``; did you mean ...?`` for argparse's error ``message``, or "" when nothing is close:
    the closest command or choice to an invalid one, the closest flag to each unknown."""
    choice = _INVALID_CHOICE.search(message)
    if choice is not None:
        options = [c.strip().strip("'") for c in choice[2].split(",")]
        close = difflib.get_close_matches(choice[1], options, n=1)
        return f"; did you mean {close[0]!r}?" if close else ""
    if _UNRECOGNIZED not in message:
        return ""
    words = message.split(_UNRECOGNIZED, 1)[1].split()
    typed = [w.split("=", 1)[0] for w in words if w.startswith("--")]
    guesses = {t: difflib.get_close_matches(t, sorted(flags), n=1) for t in typed}
    found = {t: close[0] for t, close in guesses.items() if close}
    if len(found) == 1 and len(typed) == 1:
        return f"; did you mean {next(iter(found.values()))}?"
    shown = ", ".join(f"{flag} (for {t})" for t, flag in found.items())
    return f"; did you mean {shown}?" if found else ""


def build_parser(commands: Sequence[str] = COMMANDS) -> argparse.ArgumentParser:
    """The parser with ``commands`` registered (each imports its module: all of them
    for ``--help``, only the one named on the command line otherwise)."""
    parser = _Parser(
        prog="spot-pipelines", description="Run ML pipeline steps on spot capacity, safely."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level for diagnostics on stderr (default WARNING)",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in commands:
        module = importlib.import_module(f"spot_core.commands.{name.replace('-', '_')}")
        module.register(subparsers)
    return parser


def _named_command(argv: Sequence[str]) -> tuple[str, ...]:
    """The command ``argv`` names, if its first word after the global options is one.

    Registering only that command spares every process the other commands' imports:
    the watcher that wraps each step (``spot-pipelines watch``, started per attempt)
    would otherwise load the simulator and NumPy before it starts the step."""
    words = list(argv)
    while words and words[0].startswith("--log-level"):
        words = words[1:] if "=" in words[0] else words[2:]
    return (words[0],) if words and words[0] in COMMANDS else COMMANDS


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_named_command(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe shows here, not at exit
        return code
    except SpotError as exc:
        print(f"spot-pipelines {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except ImportError as exc:
        missing = extras.explain(exc)  # an optional dependency this command reached
        if missing is None:
            raise
        print(f"spot-pipelines {args.command}: error: {missing}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"spot-pipelines {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _stdout_closed()


def _one_line(exc: Exception) -> str:
    """The error's text on one line (a file's bad row may carry a newline)."""
    return " ".join(str(exc).split())


def _stdout_closed() -> int:
    """The reader of our stdout went away (``| head``): quiet, like other Unix tools.

    Python would print a second BrokenPipeError while flushing stdout at exit, so stdout
    is pointed at /dev/null first."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE, what a shell reports for a reader that left early


if __name__ == "__main__":
    sys.exit(main())
