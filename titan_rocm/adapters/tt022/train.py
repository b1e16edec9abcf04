"""``python -m titan_rocm.train`` / ``titan-rocm-train``: TorchTitan's trainer with titan-rocm
(docs/configs.md).

Runs ``torchtitan.train`` as ``__main__``, nothing patched on it. Without torchrun it sets the
one-rank environment torchrun would give (TorchTitan reads ``LOCAL_RANK`` unconditionally)."""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence

from titan_rocm.adapters.common import LaunchError, single_process_environment
from titan_rocm.adapters.tt022.job_args import JobArgsError, prepare
from titan_rocm.torchtitan_version import TorchTitanVersionError, require


def _fail(message: str) -> None:
    print(f"titan-rocm: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> None:
    """Run TorchTitan's training entry point with ``argv`` (default ``sys.argv[1:]``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    from titan_rocm.adapters.tt022.config import JobConfig
    from titan_rocm.adapters.tt022.preflight import StartupError, bool_flags, check_bool_flags

    try:
        require("0.2", "python -m titan_rocm.train")
        args = prepare(args)
        check_bool_flags(args, bool_flags(JobConfig))
    except (JobArgsError, StartupError, TorchTitanVersionError) as exc:
        _fail(str(exc))
    if "torchtitan.config.manager" in sys.modules:
        # ConfigManager.parse_args binds sys.argv[1:] as its default when its module is
        # first imported; after that, a new sys.argv would be ignored.
        raise RuntimeError(
            "titan_rocm.train.main must run before torchtitan.config is imported; "
            "start it as `python -m titan_rocm.train` or `titan-rocm-train`"
        )
    try:
        added = single_process_environment()
    except LaunchError as exc:
        _fail(str(exc))
    if added:
        shown = ", ".join(f"{k}={added[k]}" for k in ("RANK", "WORLD_SIZE", "MASTER_PORT")
                          if k in added)
        print(f"titan-rocm: no torchrun environment: one process ({shown}), as "
              "torchrun --standalone --nproc_per_node=1 would start it", file=sys.stderr)
    import titan_rocm  # noqa: F401 - registers the converters when TorchTitan loads

    sys.argv = ["torchtitan.train", *args]
    try:
        runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
    except KeyboardInterrupt:
        print("titan-rocm: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
