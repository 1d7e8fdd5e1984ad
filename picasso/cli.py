"""The `picasso` command: one module per sub-command (picasso/commands), parsers built here.

Each module in picasso/commands defines `register(subparsers, common)` and keeps its
top-level imports light; heavy layers are imported inside its `run(args) -> int`.
Output into a pipe its reader closed (`picasso ... | head`) ends the command quietly with
status 141 (128 + SIGPIPE), as a tool killed by SIGPIPE ends.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import signal
import sys
import threading
import traceback

COMMANDS = ("synth", "analyze", "plan", "simulate", "run", "calibrate", "validate", "demo", "doctor",
            "export", "export-model", "score", "convert", "compare")


DESCRIPTION = """\
Plan, simulate and run hybrid-parallel training of recommendation models (DLRM, DCN-v2,
DeepFM, ...). picasso profiles a click log, chooses how to pack, shard and cache the
embedding tables on a cluster, predicts the training step, trains it for real with
torch.distributed, and shows how far the prediction was from the measurement."""
EPILOG = "Start with `picasso demo`; `picasso COMMAND --help` describes each command."
SIGPIPE_STATUS = 141  # 128 + SIGPIPE


class DefaultsShown(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it has none or already names it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.default in (None, False, [], argparse.SUPPRESS)
                or "default" in text):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """The parser of `picasso` and of each sub-command."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # one line: the usage block is what --help is for
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("picasso")
    except PackageNotFoundError:
        return "(not installed: run from a source tree)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="picasso", description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"picasso {version()}")
    common = Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"picasso.commands.{name.replace('-', '_')}").register(sub, common)
    return parser


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the main thread is, so child processes and temp
    folders are cleaned up on the way out exactly as for Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def _stop_signals_raise():
    """SIGTERM/SIGHUP raise Interrupted while a command runs (default: die without cleanup)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: list[str] | None = None) -> int:
    from foundation.progress import silence

    try:
        os.getcwd()
    except OSError:  # every relative path, and some libraries' start-up, would fail obscurely
        print("picasso: error: the working folder no longer exists (deleted or moved); cd to one that does",
              file=sys.stderr)
        return 2
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # --help, or a refused flag (its line is printed): a code, as for any refusal
        return int(exc.code or 0)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    silence(bool(getattr(args, "json", False)))  # --json: the output is for a program, no bar beside it
    try:
        with _stop_signals_raise():
            status = int(args.func(args) or 0)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
            return status
    except BrokenPipeError:
        # the reader stopped reading: what is left to print goes nowhere, the exit flush included
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return SIGPIPE_STATUS
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"picasso {args.command}: interrupted by {signal.Signals(signum).name}; "
              "stopped its processes", file=sys.stderr)
        return 128 + int(signum)
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        # User-facing errors: one line, no traceback (PICASSO_DEBUG=1 shows it).
        if os.environ.get("PICASSO_DEBUG"):
            traceback.print_exc()
        print(f"picasso {args.command}: error: {one_line(exc, words)}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a bug, still reported on one line
        if os.environ.get("PICASSO_DEBUG"):
            traceback.print_exc()
        print(
            f"picasso {args.command}: internal error: {type(exc).__name__}: {one_line(exc, words)} "
            "(set PICASSO_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


def one_line(exc: BaseException, words: list[str] = ()) -> str:
    """The error's first line; a name from the command line holding a line break or another control
    character is shown escaped (as repr does), so the line is neither cut nor forged by it."""
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, KeyError) and exc.args:
        key = exc.args[0]
        # a bare key is a lookup that failed; a sentence (pyarrow's 'Field "0" exists 5 times') says itself
        text = key if isinstance(key, str) and " " in key.strip() else f"unknown key {key!r}"
    for word in sorted((w for w in words if _CONTROL.search(w)), key=len, reverse=True):
        text = text.replace(word, repr(word)[1:-1])
    return text.splitlines()[0]


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


if __name__ == "__main__":
    raise SystemExit(main())
