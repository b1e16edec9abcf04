"""Check 3: the degrees against the world size, as ``ParallelDims`` and its mesh check them."""

from __future__ import annotations

from typing import Any

from titan_rocm.adapters.common import (
    StartupError,
    WorldSize,
    check_degrees,
)
from titan_rocm.adapters.common import one_line as _one_line


def check_parallelism(d: dict[str, int], world: WorldSize) -> Any:
    """TorchTitan 0.2.2's ``ParallelDims`` for degrees ``d`` on ``world``, with its mesh's
    arithmetic; raises StartupError for a degree either would refuse."""
    from torchtitan.distributed import ParallelDims

    size = world.size
    given = f"world size {size} ({world.source})"
    check_degrees(d)  # ParallelDims._validate's ranges
    fixed = d["dp_replicate"] * d["cp"] * d["tp"] * d["pp"]
    shard = d["dp_shard"]
    if shard == -1:
        shard = size // fixed
        if shard < 1:
            raise StartupError(
                f"data_parallel_shard_degree = -1 leaves {size} // (dp_replicate "
                f"{d['dp_replicate']} x cp {d['cp']} x tp {d['tp']} x pp {d['pp']}) = "
                f"{shard} ranks to shard over on {given}; it needs at least {fixed} ranks"
            )
    if fixed * shard != size:
        raise StartupError(
            f"the degrees do not fit {given}: dp_replicate({d['dp_replicate']}) * "
            f"dp_shard({shard}) * cp({d['cp']}) * tp({d['tp']}) * pp({d['pp']}) = "
            f"{fixed * shard}, and TorchTitan 0.2.2 requires it to equal the world size"
        )
    if d["ep"] > 1 and d["etp"] not in (d["tp"], 1):
        raise StartupError(
            f"expert_tensor_parallel_degree = {d['etp']} with expert parallel "
            f"{d['ep']}: TorchTitan 0.2.2 supports only ETP = TP ({d['tp']}) or ETP = 1"
        )
    dense = shard * d["cp"] * d["tp"]
    experts = d["ep"] * d["etp"]
    if dense % experts:
        raise StartupError(
            f"expert_parallel_degree {d['ep']} x expert_tensor_parallel_degree {d['etp']} = "
            f"{experts} does not divide dp_shard {shard} x cp {d['cp']} x tp {d['tp']} = "
            f"{dense} on {given}, so TorchTitan 0.2.2 cannot build its expert device mesh"
        )
    try:
        return ParallelDims(world_size=size, **d)
    except AssertionError as exc:  # a check of a newer ParallelDims not mirrored above
        raise StartupError(
            f"the degrees do not fit {given}: {_one_line(exc)}"
        ) from None
