"""What the audit reads and changes of FSDP2 (``fully_shard``) internals, in one place."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn


class FsdpError(RuntimeError):
    """This torch's FSDP cannot be raised for the reference pass (one sentence)."""


def param_groups(modules: list[nn.Module]) -> list[Any]:
    """The FSDP parameter groups of the FSDP states of ``modules`` and their submodules."""
    groups, seen = [], set()
    for root in modules:
        for module in root.modules():
            state_of = getattr(module, "_get_fsdp_state", None)
            if callable(state_of):
                group = getattr(state_of(), "_fsdp_param_group", None)
                if group is not None and id(group) not in seen:
                    seen.add(id(group))
                    groups.append(group)
    return groups


def is_fsdp(modules: list[nn.Module]) -> bool:
    """Whether any module is an FSDP2 (``fully_shard``) module."""
    return any(callable(getattr(m, "_get_fsdp_state", None))
               for root in modules for m in root.modules())


def compute_dtype(modules: list[nn.Module]) -> torch.dtype | None:
    """The dtype FSDP all-gathers the parameters in (its mixed-precision ``param_dtype``),
    None without FSDP mixed precision."""
    for group in param_groups(modules):
        for fsdp_param in getattr(group, "fsdp_params", []):
            dtype = getattr(fsdp_param, "param_dtype", None)
            if dtype is not None:
                return dtype
        policy = getattr(group, "mp_policy", None)
        if getattr(policy, "param_dtype", None) is not None:
            return policy.param_dtype
    return None


@contextlib.contextmanager
def raised(modules: list[nn.Module], exclude: list[nn.Module] = ()) -> Iterator[None]:
    """FSDP all-gathers the sharded parameters of ``modules`` (less ``exclude``'s) as they
    are (their float32 originals) into buffers of the pass's own, and reduces gradients in
    their dtype; the job's buffers, dtypes and unsharded parameters are put back on exit.

    Raises:
        FsdpError: FSDP mixed precision on a torch whose FSDP keeps no swappable buffers.
    """
    saved: list[tuple[Any, str, Any]] = []
    skip = {id(g) for g in param_groups(list(exclude))}
    try:
        for group in [g for g in param_groups(modules) if id(g) not in skip]:
            for fsdp_param in group.fsdp_params:
                if getattr(fsdp_param, "reduce_dtype", None) is not None:
                    saved.append((fsdp_param, "reduce_dtype", fsdp_param.reduce_dtype))
                    fsdp_param.reduce_dtype = None
                if getattr(fsdp_param, "param_dtype", None) is not None:
                    if not isinstance(getattr(fsdp_param, "all_gather_outputs", None), list):
                        raise FsdpError(
                            f"FSDP mixed precision ({str(fsdp_param.param_dtype)[6:]} "
                            "parameters) cannot be raised for the reference pass by this "
                            "torch's FSDP: audit this job with "
                            "--training.mixed_precision_param float32, or without FSDP on "
                            "fewer GPUs")
                    saved += [(fsdp_param, "param_dtype", fsdp_param.param_dtype),
                              (fsdp_param, "all_gather_outputs", fsdp_param.all_gather_outputs)]
                    fsdp_param.param_dtype = None
                    fsdp_param.all_gather_outputs = []
                    if hasattr(fsdp_param, "_unsharded_param"):
                        saved.append((fsdp_param, "_unsharded_param",
                                      fsdp_param._unsharded_param))
                        del fsdp_param._unsharded_param
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)


def reshard(modules: list[nn.Module]) -> None:
    """Free every unsharded parameter of ``modules``' FSDP modules (a replay of one block can
    leave the next one all-gathered by forward prefetching)."""
    for root in modules:
        for module in root.modules():
            if callable(getattr(module, "_get_fsdp_state", None)) and callable(
                    getattr(module, "reshard", None)):
                module.reshard()
