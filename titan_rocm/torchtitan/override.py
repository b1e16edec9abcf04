"""The fallback for jobs that must keep their own ``--module``: an ``@override`` entry.

::

    python -m torchtitan.train --module my_pkg.configs --config my_job \\
        --override.imports 'titan_rocm.torchtitan.override.rocm={"moe_eager_compile": "off"}'

TorchTitan 0.3.0 applies overrides inside ``Trainer.__init__`` (``config/override.py``
``apply_overrides``), after ``init_distributed`` and before the model is built; an override
replaces one node of the config tree and cannot replace the root, so it cannot make the job's
trainer a ``RocmTrainer``. This one claims the model config (and returns it unchanged), finds
the trainer being built in the call stack, and does what ``RocmTrainer`` does, on that
instance: the same :class:`~titan_rocm.adapters.tt030.job.RocmJob` (context, start-up checks,
decisions, the wrapped parallelize/pipelining functions), and the trainer's ``train_step``,
``forward_backward_step`` and ``close`` replaced on the instance by the same calls.

Its limits (docs/torchtitan-0.3.md): settings come as the entry's JSON, not ``--rocm.*`` flags,
and are checked when the trainer is built, not when the command line is parsed; the model
spec's functions are wrapped in place, in the config object the job built; the seams attach
at the first ``train_step`` (the optimizers do not exist yet when overrides run); it needs
TorchTitan 0.3.0's ``Trainer.__init__`` on the stack; ``titan-rocm plan`` does not read it.
"""

from __future__ import annotations

import inspect
from typing import Any

from torchtitan.config import override
from torchtitan.protocols.model import BaseModel

from titan_rocm.adapters.tt030.job import OVERRIDE_ENTRY, RocmJob
from titan_rocm.adapters.tt030.trainer import RocmTrainerMixin
from titan_rocm.log import log
from titan_rocm.settings import check_section

ENTRY = OVERRIDE_ENTRY
"""What users list in ``--override.imports``: this module's :func:`rocm`."""


def building_trainer() -> Any:
    """The TorchTitan 0.3.0 trainer whose ``__init__`` is on the call stack.

    Raises:
        RuntimeError: none is (the override was applied outside a trainer).
    """
    from torchtitan.trainer import Trainer

    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if frame.f_code.co_name == "__init__" and isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    raise RuntimeError(
        f"{ENTRY} runs only from TorchTitan 0.3.0's Trainer.__init__ (--override.imports); "
        "no trainer is being built here"
    )


def graft(trainer: Any, job: RocmJob) -> None:
    """Give ``trainer`` (an instance) the calls :class:`RocmTrainerMixin` makes."""
    train_step, forward_backward_step = trainer.train_step, trainer.forward_backward_step
    close = trainer.close
    attached: list[bool] = []

    def rocm_train_step(data_iterator: Any) -> Any:
        if not attached:
            attached.append(True)
            job.attach(trainer)
        return job.train_step(train_step, trainer.step, data_iterator)

    def rocm_forward_backward_step(*, input_dict: Any, labels: Any,
                                   global_valid_tokens: Any) -> Any:
        loss = forward_backward_step(input_dict=input_dict, labels=labels,
                                     global_valid_tokens=global_valid_tokens)
        job.after_forward_backward(loss, labels, global_valid_tokens)
        return loss

    def rocm_close() -> None:
        try:
            job.close()
        finally:
            close()

    trainer.train_step = rocm_train_step
    trainer.forward_backward_step = rocm_forward_backward_step
    trainer.close = rocm_close
    # Wrapped now, not at the first step's attach: that step already runs the bare one.
    job.stop_cleanly(trainer)


@override(target=BaseModel.Config, description="titan-rocm workarounds (ROCm), as RocmTrainer")
def rocm(model_config: Any, **settings: Any) -> Any:
    """titan-rocm on the trainer being built, with ``settings`` (the entry's JSON).

    Raises:
        ValueError: a setting is unknown or its value is not accepted.
    """
    trainer = building_trainer()
    if isinstance(trainer, RocmTrainerMixin):
        log.warning("titan-rocm: %s ignored: the trainer is already a %s",
                    ENTRY, type(trainer).__name__)
        return model_config
    job = RocmJob(check_section(dict(settings)))
    spec = trainer.config.model_spec
    job.start(trainer.config, trainer.parallel_dims, spec.parallelize_fn)
    spec.parallelize_fn = job.wrap_parallelize(spec.parallelize_fn)
    if spec.pipelining_fn is not None:
        spec.pipelining_fn = job.wrap_pipelining(spec.pipelining_fn)
    graft(trainer, job)
    log.info("titan-rocm: %s: workarounds attached to %s", ENTRY, type(trainer).__name__)
    return model_config
