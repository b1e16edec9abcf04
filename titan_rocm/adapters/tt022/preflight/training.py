"""Check 4: the train spec, pipelining support and the batch-size arithmetic."""

from __future__ import annotations

from typing import Any

from titan_rocm.adapters.common import StartupError
from titan_rocm.numbers import Bounds

LOCAL_BATCH = Bounds(int, 1, 10**9)
"""At least one sequence per rank (0 would divide by zero); a billion is a typo."""


def check_training(job_config: Any, parallel_dims: Any) -> None:
    """Trainer.__init__'s train spec, pipelining and batch-size checks; raises StartupError."""
    from torchtitan.protocols.train_spec import get_train_spec

    try:
        spec = get_train_spec(job_config.model.name)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    if parallel_dims.pp_enabled and not spec.pipelining_fn:
        raise StartupError(
            f"Pipeline Parallel is enabled but {job_config.model.name} does not support "
            "pipelining (TorchTitan 0.2.2)"
        )
    t = job_config.training
    batch_degree = parallel_dims.dp_replicate * parallel_dims.dp_shard
    try:
        LOCAL_BATCH.check(t.local_batch_size, "[training] local_batch_size =")
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    global_batch = t.global_batch_size
    if global_batch < 0:
        global_batch = t.local_batch_size * batch_degree
    if global_batch == 0 or global_batch % (t.local_batch_size * batch_degree):
        raise StartupError(
            "global batch size must be multiple of local batch size times data-parallel "
            f"degree ({global_batch} % ({t.local_batch_size} * {batch_degree}) != 0) "
            "(TorchTitan 0.2.2; -1 means local batch size times data-parallel degree)"
        )
