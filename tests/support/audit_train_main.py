"""``torchrun -m tests.support.audit_train_main [flags]``: train with
:class:`tests.support.audit_trainer.AuditTrainer` (the job's own ``parallelize_fn``: FSDP with
its mixed precision, compiled blocks) on CPU over gloo, as ``torchtitan.train`` would; the
harness defaults (``cpu_trainer.BASE_ARGS``) come first. Tests only."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from torchtitan.config import ConfigManager
    from torchtitan.train import main

    import titan_rocm  # noqa: F401 - registers the rocm converters
    from tests.support.audit_trainer import AuditTrainer
    from tests.support.cpu_trainer import BASE_ARGS

    # As cpu_trainer's own entry: parse_args binds sys.argv[1:] at import, so add the defaults.
    _parse = ConfigManager.parse_args
    ConfigManager.parse_args = lambda self, args=None: _parse(  # type: ignore[method-assign]
        self, BASE_ARGS + sys.argv[1:] if args is None else args
    )
    main(AuditTrainer)
