"""The `picasso` command: a dispatcher over one module per sub-command.

Each module in picasso/commands defines `register(subparsers, common)` and keeps its
top-level imports light; heavy layers are imported inside its `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

COMMANDS = ("synth", "analyze", "plan", "simulate", "run", "calibrate", "validate", "demo", "doctor",
            "export", "convert")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="picasso", description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"picasso.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"picasso.commands.{name}":
                raise
            continue
        module.register(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("picasso: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        # User-facing errors: one line, no traceback (PICASSO_DEBUG=1 shows it).
        if os.environ.get("PICASSO_DEBUG"):
            traceback.print_exc()
        print(f"picasso {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a bug, still reported on one line
        if os.environ.get("PICASSO_DEBUG"):
            traceback.print_exc()
        print(
            f"picasso {args.command}: internal error: {type(exc).__name__}: {one_line(exc)} "
            "(set PICASSO_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


def one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, KeyError) and text.startswith("'"):
        text = f"unknown key {text}"
    return text.splitlines()[0]


if __name__ == "__main__":
    raise SystemExit(main())
