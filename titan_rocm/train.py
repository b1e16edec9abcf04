"""``python -m titan_rocm.train`` / ``titan-rocm-train``: TorchTitan's trainer with titan-rocm.

Runs ``torchtitan.train`` exactly as ``python -m torchtitan.train`` would (as ``__main__``,
unchanged, nothing patched on the trainer module), after three things that otherwise need
lines in the TOML: titan-rocm's converters are registered (no ``custom_import`` needed),
``[rocm]`` / ``--rocm.*`` parse (``job.custom_config_module`` is added when absent), and the
TOML's ``[rocm]`` table is checked with a message listing accepted keys and values.

Works under torchrun: ``torchrun --nproc_per_node=8 -m titan_rocm.train --job.config_file X``.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence

from titan_rocm.job_args import JobArgsError, prepare
from titan_rocm.torchtitan_version import TorchTitanVersionError, require


def main(argv: Sequence[str] | None = None) -> None:
    """Run TorchTitan's training entry point with ``argv`` (default ``sys.argv[1:]``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        require("0.2", "python -m titan_rocm.train")
        args = prepare(args)
    except (JobArgsError, TorchTitanVersionError) as exc:
        print(f"titan-rocm: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if "torchtitan.config.manager" in sys.modules:
        # ConfigManager.parse_args binds sys.argv[1:] as its default when its module is
        # first imported; after that, a new sys.argv would be ignored.
        raise RuntimeError(
            "titan_rocm.train.main must run before torchtitan.config is imported; "
            "start it as `python -m titan_rocm.train` or `titan-rocm-train`"
        )
    import titan_rocm  # noqa: F401 - registers the converters when TorchTitan loads

    sys.argv = ["torchtitan.train", *args]
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
