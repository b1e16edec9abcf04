"""``titan-rocm``: the command-line front door; each subcommand (``titan_rocm.cli.<name>``) is
imported only when it runs, so ``titan-rocm scan`` never pays for torch.

Kept here once for every subcommand: bad input is one sentence and exit 2; ``--json`` prints exactly
one JSON object on every exit path; a closed pipe ends quietly with 141."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

SUBCOMMANDS: dict[str, str] = {
    "plan": "titan_rocm.cli.plan",
    "scan": "titan_rocm.cli.scan",
    "check-log": "titan_rocm.cli.check_log",
    "bench-summary": "titan_rocm.cli.bench_summary",
    "compare": "titan_rocm.cli.compare",
    "gemm-tables": "titan_rocm.cli.gemm_tables",
    "tune": "titan_rocm.cli.tune",
    "audit": "titan_rocm.cli.audit",
}

_HELP: dict[str, str] = {
    "plan": "show what a TorchTitan job would get from titan-rocm, without a GPU",
    "scan": "audit AMDGCN files (Triton caches) for the buffer-store data hazard",
    "check-log": "require every logged loss and grad norm of a training log to be finite",
    "bench-summary": "throughput summary of a training log; invalid if it diverged",
    "compare": "training runs side by side against a baseline and its noise band",
    "gemm-tables": "make aiter's tuned GEMM tables safe for HIP-graph capture",
    "tune": "validated GEMM tuning: collect, run (checked, crash-isolated), table",
    "audit": "check a compiled job block by block against eager and high-precision replays",
}


JSON_SCHEMA = 1
"""Version of the error envelope's layout (``plan --json`` has its own: PLAN_SCHEMA)."""

INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), as shells report it."""

BROKEN_PIPE = 141
"""Exit code when stdout's reader went away (128 + SIGPIPE), as shells report it."""


class CommandError(Exception):
    """How a subcommand refuses bad input or stops: ``main`` prints ``titan-rocm <command>:
    <message>`` (and the error object under ``--json``) and exits with ``code`` (2 by default)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def as_command_error(*errors: type[BaseException]) -> Iterator[None]:
    """Refuse with :class:`CommandError` when the block raises one of ``errors`` (no traceback)."""
    try:
        yield
    except errors as exc:
        raise CommandError(str(exc)) from None


class _ArgumentError(Exception):
    """argparse rejected the command line (the usage and message are already on stderr)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad option raises instead of exiting, so ``main`` can still answer in JSON.
    """

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise _ArgumentError(message)


def error_envelope(command: str, message: str, code: int) -> dict[str, Any]:
    """The one JSON object a ``--json`` command prints when it has no report to give."""
    return {"schema": JSON_SCHEMA, "command": command, "exit_code": code, "error": message}


def error_report(command: str, message: str, code: int) -> dict[str, Any]:
    """``command``'s error object: its module's ``error_report`` where it has one, else
    :func:`error_envelope`."""
    module = sys.modules.get(SUBCOMMANDS[command])
    own = getattr(module, "error_report", None)
    return own(message, code) if own is not None else error_envelope(command, message, code)


def _print_envelope(command: str, message: str, code: int) -> None:
    print(json.dumps(error_report(command, message, code), indent=2))


def _parser_for(name: str) -> argparse.ArgumentParser:
    module = importlib.import_module(SUBCOMMANDS[name])
    parser = _Parser(prog=f"titan-rocm {name}", description=module.HELP)
    module.add_arguments(parser)
    parser.set_defaults(_run=module.run, _passthrough=getattr(module, "PASSTHROUGH", False))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``titan-rocm`` with ``argv``; return the exit code (Ctrl-C: 130, closed stdout: 141)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[0] if argv and argv[0] in SUBCOMMANDS else ""
    # Before parsing, --json is known only by its spelling; it is a flag of every command.
    wants_json = bool(name) and "--json" in argv[1:]
    try:
        try:
            return _main(argv, wants_json)
        except KeyboardInterrupt:
            print(f"titan-rocm{' ' + name if name else ''}: interrupted", file=sys.stderr)
            if wants_json:
                _print_envelope(name, "interrupted", INTERRUPTED)
            return INTERRUPTED
        finally:
            sys.stdout.flush()  # a closed pipe shows here, inside the handler below
    except BrokenPipeError:
        # Python would report the pipe again at exit, flushing stdout: point it at devnull.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return BROKEN_PIPE


def console_main() -> NoReturn:
    """The ``titan-rocm`` executable. After Ctrl-C it ends at once with 130: a KeyboardInterrupt
    during a C extension's import can otherwise make Python kill itself with SIGINT at exit."""
    code = main()
    if code == INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(INTERRUPTED)
    sys.exit(code)


def _main(argv: list[str], wants_json: bool) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        lines = ["usage: titan-rocm <command> [options]", "", "commands:"]
        lines += [f"  {name:<14} {_HELP[name]}" for name in SUBCOMMANDS]
        lines += ["", "titan-rocm <command> --help shows a command's options."]
        print("\n".join(lines))
        return 0 if argv else 2
    if argv[0] == "--version":
        from titan_rocm import __version__

        print(f"titan-rocm {__version__}")
        return 0
    if argv[0] not in SUBCOMMANDS:
        print(
            f"titan-rocm: unknown command {argv[0]!r}; choose one of: {', '.join(SUBCOMMANDS)}",
            file=sys.stderr,
        )
        return 2
    name = argv[0]
    parser = _parser_for(name)
    try:
        if parser.get_default("_passthrough"):
            # Options the command does not know are handed on (plan: TorchTitan's flags).
            args, rest = parser.parse_known_args(argv[1:])
            args.passthrough = rest
        else:
            args = parser.parse_args(argv[1:])
    except _ArgumentError as exc:
        if wants_json:
            _print_envelope(name, str(exc), 2)
        return 2
    except SystemExit as exc:  # argparse exits 0 after --help
        return int(exc.code or 0)
    try:
        return int(args._run(args))
    except CommandError as exc:
        print(f"titan-rocm {name}: {exc}", file=sys.stderr)
        if getattr(args, "json", False):
            _print_envelope(name, str(exc), exc.code)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
