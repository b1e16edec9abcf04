"""Everything the numerics audit reads or changes inside FSDP2 (``fully_shard``).

FSDP2 keeps its state in private objects; the audit reads them to know the job's compute dtype
and changes them to run its reference pass at the sharded parameters' own precision. Every
such access is in this module, against these layouts (``torch/distributed/fsdp/_fully_shard/``,
torch 2.13.0 at cf30153c, 2.14.1 at 5c488690, 2.15.0 at d0f2af8b; file:line per version):

- the state: ``FSDPModule._get_fsdp_state()`` (``_fully_shard.py`` 2.13.0:881, 2.14.1:881,
  2.15.0:1085) returns the module's ``FSDPState``, whose ``_fsdp_param_groups`` is a list of
  ``FSDPParamGroup`` (``_fsdp_state.py`` 2.13.0:67, 2.14.1:67, 2.15.0:75: one group per mesh;
  the singular ``_fsdp_param_group`` property refuses more than one). A grouped
  ``fully_shard([a, b])`` gives ``a`` and ``b`` the same state, so states are counted once.
- the group's ``fsdp_params``: one ``FSDPParam`` per parameter (``_fsdp_param_group.py``
  2.13.0:170, 2.14.1:171, 2.15.0:220).
- the mixed-precision policy: 2.13 and 2.14 keep it on the group (``self.mp_policy``,
  ``_fsdp_param_group.py`` 2.13.0:187, 2.14.1:188) and hand the same object to each
  ``FSDPParam`` (``_fsdp_param.py`` 2.13.0:206, 2.14.1:227). 2.15 resolves it per parameter
  (``mp_policy._resolve_for_param(param)``, ``_fsdp_param_group.py`` 2.15.0:228, through
  the new ``MixedPrecisionPolicy.param_dtype_override_fn``, ``_fsdp_api.py`` 2.15.0:82-86,
  which may keep a parameter in its own dtype) and stores it only on the ``FSDPParam``
  (``_fsdp_param.py`` 2.15.0:240); the group has no ``mp_policy``. So the policy is read from
  each ``FSDPParam``, with its ``sharded_param`` (2.13.0:325, 2.14.1:358, 2.15.0:375).

A state, ``FSDPParam`` or policy without these attributes raises :class:`FSDPLayoutError`
(one sentence): a torch laid out otherwise is refused, never read as float32.
- the dtypes FSDP acts on: ``FSDPParam.init_dtype_attrs`` (``_fsdp_param.py`` 2.13.0:586,
  2.14.1:801, 2.15.0:820) sets ``param_dtype`` (None where it equals the sharded dtype) and
  ``reduce_dtype`` from the policy at FSDP's lazy init (the first forward), not before.
- the forward's casts: the state's own policy ``FSDPState._mp_policy`` (``_fsdp_state.py``
  2.13.0:117, 2.14.1:117, 2.15.0:125) casts the module's floating inputs to its
  ``param_dtype`` (``_cast_forward_inputs``: 2.13.0:346, 2.14.1:351, 2.15.0:372, when
  ``cast_forward_inputs``, TorchTitan's default) and its outputs to ``output_dtype``
  (``_cast_output_dtype``: 2.13.0:355, 2.14.1:360, 2.15.0:381).
- the all-gather buffers ``all_gather_outputs`` (``_fsdp_param.py`` 2.13.0:216, 2.14.1:237,
  2.15.0:250), allocated once in ``param_dtype`` by ``init_all_gather_outputs`` (2.13.0:616,
  2.14.1:831, 2.15.0:880: an empty list is allocated again), and the unsharded parameter
  ``_unsharded_param``, made once from them by ``init_unsharded_param`` (2.13.0:630,
  2.14.1:845, 2.15.0:894: absent, it is made again).

The group's own reduce dtype (``FSDPParamGroup._reduce_dtype``) is left as it is: TorchTitan
reduces in float32 whatever ``param_dtype`` is (``mixed_precision_reduce: Literal["float32"]``,
torchtitan 0.2.2 ``config/job_config.py``:290, 0.3.0 ``config/configs.py``:93), which is the
reference's dtype.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn as nn

LAYOUTS = "torch 2.13 to 2.15"


class FSDPLayoutError(RuntimeError):
    """This torch's FSDP is not laid out as this module reads it, or cannot run a pass at its
    sharded parameters' dtype."""


def _unknown(what: str) -> FSDPLayoutError:
    return FSDPLayoutError(
        f"this torch's FSDP ({torch.__version__}) has no {what}: titan-rocm reads FSDP2 as "
        f"{LAYOUTS} lay it out; audit on one of those, or without FSDP on fewer GPUs")


def is_fsdp(modules: Iterable[nn.Module]) -> bool:
    """Whether any module of ``modules`` (or below them) is an FSDP2 module."""
    return any(callable(getattr(m, "_get_fsdp_state", None))
               for module in modules for m in module.modules())


def fsdp_states(modules: Iterable[nn.Module]) -> list[Any]:
    """The FSDP states of ``modules`` and below, each once (a grouped ``fully_shard`` shares
    one)."""
    states: dict[int, Any] = {}
    for module in modules:
        for m in module.modules():
            state_of = getattr(m, "_get_fsdp_state", None)
            if callable(state_of):
                state = state_of()
                states.setdefault(id(state), state)
    return list(states.values())


def param_groups(modules: Iterable[nn.Module]) -> list[Any]:
    """The ``FSDPParamGroup`` of every FSDP state of ``modules`` (and below), each once."""
    groups: dict[int, Any] = {}
    for state in fsdp_states(modules):
        for group in _groups_of(state):
            groups.setdefault(id(group), group)
    return list(groups.values())


def _groups_of(state: Any) -> list[Any]:
    groups = getattr(state, "_fsdp_param_groups", None)
    if not isinstance(groups, list):
        raise _unknown("FSDPState._fsdp_param_groups list")
    return groups


def _sharded_dtype(fsdp_param: Any) -> torch.dtype:
    sharded = getattr(fsdp_param, "sharded_param", None)
    if not isinstance(sharded, torch.Tensor):
        raise _unknown("FSDPParam.sharded_param")
    return sharded.dtype


def _policy_dtype(fsdp_param: Any) -> torch.dtype | None:
    """As ``init_dtype_attrs`` clamps it; None for a non-floating parameter."""
    orig = _sharded_dtype(fsdp_param)
    if not orig.is_floating_point:
        return None
    if not hasattr(fsdp_param, "mp_policy"):
        raise _unknown("FSDPParam.mp_policy")
    param_dtype = fsdp_param.mp_policy.param_dtype
    return orig if param_dtype is None else param_dtype


def compute_dtype(modules: Iterable[nn.Module]) -> torch.dtype | None:
    """The least precise dtype of the FSDP-managed parameters of ``modules`` (2.15 may keep some in
    their own dtype); None where FSDP manages no floating parameter."""
    dtypes = {dtype for group in param_groups(modules) for p in group.fsdp_params
              if (dtype := _policy_dtype(p)) is not None}
    if not dtypes:
        return None
    return max(dtypes, key=lambda d: (torch.finfo(d).eps, -d.itemsize, str(d)))


def _raise_casts(state: Any, saved: list[tuple[Any, str, Any]]) -> None:
    if not hasattr(state, "_mp_policy"):
        raise _unknown("FSDPState._mp_policy")
    policy = state._mp_policy
    if policy.param_dtype is None and policy.output_dtype is None:
        return
    sharded = {dtype for group in _groups_of(state) for p in group.fsdp_params
               if (dtype := _sharded_dtype(p)).is_floating_point}
    cast = policy.cast_forward_inputs and policy.param_dtype is not None and len(sharded) == 1
    saved.append((state, "_mp_policy", policy))
    state._mp_policy = dataclasses.replace(
        policy, param_dtype=sharded.pop() if cast else None, output_dtype=None)


@contextlib.contextmanager
def raised_to_sharded_dtype(modules: Iterable[nn.Module],
                            exclude: Iterable[nn.Module] = ()) -> Iterator[None]:
    """Within the block, the FSDP parameters of ``modules``' states (less ``exclude``'s) compute and
    reduce in their sharded dtype (the job's float32 originals); all put back on exit.

    Each ``FSDPParam`` gathers into buffers of its own, so the job's low-precision buffers are
    neither written nor freed; modules are resharded on entry, as an all-gathered one keeps its
    low-precision parameters. Enter after FSDP's lazy init, which sets the dtypes (else
    FSDPLayoutError)."""
    saved: list[tuple[Any, str, Any]] = []
    skip = {id(state) for state in fsdp_states(exclude)}
    states = [state for state in fsdp_states(modules) if id(state) not in skip]
    groups: dict[int, Any] = {}
    for state in states:
        for group in _groups_of(state):
            groups.setdefault(id(group), group)
    owners = [m for module in modules for m in module.modules()
              if callable(getattr(m, "_get_fsdp_state", None))
              and id(m._get_fsdp_state()) in {id(state) for state in states}]
    # A group left all-gathered (the root after a forward without backward keeps its
    # low-precision parameters registered) would not all-gather again at the raised dtype.
    reshard(owners)
    try:
        for state in states:
            _raise_casts(state, saved)
        for group in groups.values():
            for fsdp_param in group.fsdp_params:
                _raise_param(fsdp_param, saved)
        yield
    finally:
        reshard(owners)  # frees the raised parameters and registers the shards again
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)


def _raise_param(fsdp_param: Any, saved: list[tuple[Any, str, Any]]) -> None:
    if not hasattr(fsdp_param, "param_dtype"):  # before FSDP's lazy init
        if _policy_dtype(fsdp_param) in (None, _sharded_dtype(fsdp_param)):
            return  # it will compute in its sharded dtype anyway
        raise FSDPLayoutError(
            "FSDP has not set its parameters' dtypes yet (no forward has run): "
            "run the job's own pass before the reference pass")
    if getattr(fsdp_param, "reduce_dtype", None) is not None:
        saved.append((fsdp_param, "reduce_dtype", fsdp_param.reduce_dtype))
        fsdp_param.reduce_dtype = None
    if fsdp_param.param_dtype is None:
        return
    if not isinstance(getattr(fsdp_param, "all_gather_outputs", None), list):
        raise FSDPLayoutError(
            f"FSDP mixed precision ({str(fsdp_param.param_dtype)[6:]} parameters) "
            "cannot be raised for the reference pass by this torch's FSDP: audit "
            "this job with --training.mixed_precision_param float32, or without "
            "FSDP on fewer GPUs")
    saved += [(fsdp_param, "param_dtype", fsdp_param.param_dtype),
              (fsdp_param, "all_gather_outputs", fsdp_param.all_gather_outputs)]
    fsdp_param.param_dtype = None
    fsdp_param.all_gather_outputs = []
    if hasattr(fsdp_param, "_unsharded_param"):
        saved.append((fsdp_param, "_unsharded_param", fsdp_param._unsharded_param))
        del fsdp_param._unsharded_param


def reshard(modules: Iterable[nn.Module]) -> None:
    """Free every unsharded parameter: a replay of one block can leave the next one all-gathered by
    forward prefetching."""
    for module in modules:
        for m in module.modules():
            if callable(getattr(m, "_get_fsdp_state", None)) and callable(
                    getattr(m, "reshard", None)):
                m.reshard()


@contextlib.contextmanager
def unsharded(module: nn.Module) -> Iterator[None]:
    """``module``'s FSDP-managed parameters gathered whole for the block (FSDPModule's public
    ``unshard``/``reshard``): a child called alone then runs on whole parameters, as the
    block's forward would; their gradients are cleared before the shards come back."""
    managed = [m for m in module.modules() if callable(getattr(m, "_get_fsdp_state", None))]
    if any(not callable(getattr(m, "unshard", None)) or not callable(getattr(m, "reshard", None))
           for m in managed):
        raise _unknown("an FSDP module without unshard()/reshard()")
    for m in managed:
        m.unshard()
    try:
        yield
    finally:
        for p in module.parameters():
            p.grad = None
        reshard([module])
