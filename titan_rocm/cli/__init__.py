"""``titan-rocm``: the command-line front door.

Each subcommand lives in its own module ``titan_rocm.cli.<name>`` that defines
``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``; one that sets
``PASSTHROUGH = True`` receives the options it does not know in ``args.passthrough``.
Modules are imported only when their subcommand runs, so ``titan-rocm scan`` never pays for torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

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
    "audit": "prove a compiled job's gradients against eager references, per parameter",
}


def _parser_for(name: str) -> argparse.ArgumentParser:
    module = importlib.import_module(SUBCOMMANDS[name])
    parser = argparse.ArgumentParser(prog=f"titan-rocm {name}", description=module.HELP)
    module.add_arguments(parser)
    parser.set_defaults(_run=module.run, _passthrough=getattr(module, "PASSTHROUGH", False))
    return parser


INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), as shells report it."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``titan-rocm`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code.

    Ctrl-C anywhere prints one line and returns 130 (a command that must say what it left
    behind, such as ``gemm-tables``, says so itself first).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except KeyboardInterrupt:
        name = argv[0] if argv and argv[0] in SUBCOMMANDS else ""
        print(f"titan-rocm{' ' + name if name else ''}: interrupted", file=sys.stderr)
        return INTERRUPTED


def console_main() -> NoReturn:
    """The ``titan-rocm`` executable (and ``python -m titan_rocm.cli``): :func:`main`, then exit.

    After Ctrl-C the process ends at once with 130: a KeyboardInterrupt that landed while a
    C extension was being imported can otherwise make Python kill itself with SIGINT at exit,
    after the one line was printed.
    """
    code = main()
    if code == INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(INTERRUPTED)
    sys.exit(code)


def _main(argv: list[str]) -> int:
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
    parser = _parser_for(argv[0])
    try:
        if parser.get_default("_passthrough"):
            # Options the command does not know are handed on (plan: TorchTitan's flags).
            args, rest = parser.parse_known_args(argv[1:])
            args.passthrough = rest
        else:
            args = parser.parse_args(argv[1:])
    except SystemExit as exc:  # argparse exits 2 on bad options, 0 on --help
        return int(exc.code or 0)
    return int(args._run(args))


if __name__ == "__main__":
    sys.exit(main())
