"""titan_rocm.numerics.fsdp: the audit's reads and changes of FSDP2's private state.

Stand-ins copy each torch's layout (``torch/distributed/fsdp/_fully_shard/``, cited per class
below: 2.13.0 cf30153c, 2.14.1 5c488690, 2.15.0 d0f2af8b); the real ``fully_shard`` runs on
two gloo ranks with whichever torch runs the suite (``scripts/compat.sh`` runs it on others).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from titan_rocm.numerics import fsdp

BF16, F32 = torch.bfloat16, torch.float32
LAYOUTS = ("2.13.0", "2.14.1", "2.15.0")

# -- stand-ins --------------------------------------------------------------------------------


class FakeFSDPParam:
    """``FSDPParam`` (``_fsdp_param.py``): ``mp_policy`` kept as given (2.13.0:206, 2.14.1:227,
    2.15.0:240), ``sharded_param`` (2.13.0:325, 2.14.1:358, 2.15.0:375), ``all_gather_outputs``
    (2.13.0:216, 2.14.1:237, 2.15.0:250); ``param_dtype``/``reduce_dtype`` only from
    ``init_dtype_attrs`` at lazy init (2.13.0:586, 2.14.1:801, 2.15.0:820: 2.13 and 2.14 clamp
    a ``reduce_dtype`` equal to ``param_dtype`` to None, 2.15 keeps it)."""

    def __init__(self, param: nn.Parameter, mp_policy: MixedPrecisionPolicy, layout: str):
        self.mp_policy = mp_policy
        self.sharded_param = nn.Parameter(param.detach().clone(),
                                          requires_grad=param.requires_grad)
        self.all_gather_outputs: list[torch.Tensor] = []
        self._layout = layout

    def init_dtype_attrs(self, mp_policy: MixedPrecisionPolicy) -> None:
        param_dtype, reduce_dtype = mp_policy.param_dtype, mp_policy.reduce_dtype
        self.orig_dtype = self.sharded_param.dtype
        if self._layout != "2.15.0" and reduce_dtype == param_dtype:
            reduce_dtype = None
        if param_dtype == self.orig_dtype or not self.orig_dtype.is_floating_point:
            param_dtype = None
        self.param_dtype = param_dtype
        self.reduce_dtype = reduce_dtype

    def unshard(self) -> None:
        """One rank's ``init_all_gather_outputs`` (allocates only into an empty list: 2.13.0:616,
        2.14.1:831, 2.15.0:880) and ``init_unsharded_param`` (made once: 2.13.0:630,
        2.14.1:845, 2.15.0:894)."""
        if not self.all_gather_outputs:
            dtype = self.param_dtype or self.orig_dtype
            self.all_gather_outputs = [torch.empty(self.sharded_param.numel(), dtype=dtype)]
        self.all_gather_outputs[0].copy_(self.sharded_param.detach().flatten())
        if not hasattr(self, "_unsharded_param"):
            self._unsharded_param = nn.Parameter(
                self.all_gather_outputs[0].view(self.sharded_param.shape),
                requires_grad=self.sharded_param.requires_grad)


def resolve_for_param(policy: MixedPrecisionPolicy, param: nn.Parameter,
                      override: Any) -> MixedPrecisionPolicy:
    """2.15's ``MixedPrecisionPolicy._resolve_for_param`` (``_fsdp_api.py`` 2.15.0:86): the
    override's dtype (``param_dtype_override_fn``, 2.15.0:82) for this parameter, if any."""
    chosen = override(param) if override is not None else None
    return policy if chosen is None else dataclasses.replace(policy, param_dtype=chosen)


class FakeGroup:
    """``FSDPParamGroup``: 2.13/2.14 hand every ``FSDPParam`` the group's policy and keep it as
    ``self.mp_policy`` (``_fsdp_param_group.py`` 2.13.0:170-187, 2.14.1:171-188); 2.15 hands
    each its resolved policy (2.15.0:220-228) and keeps none. ``lazy_init`` runs
    ``init_dtype_attrs`` with it (``_init_mp_dtypes``: 2.13.0:275, 2.14.1:276, 2.15.0:332)."""

    def __init__(self, params: list[nn.Parameter], mp_policy: MixedPrecisionPolicy,
                 layout: str, override: Any = None):
        if layout == "2.15.0":
            self.fsdp_params = [FakeFSDPParam(p, resolve_for_param(mp_policy, p, override),
                                              layout) for p in params]
        else:
            self.fsdp_params = [FakeFSDPParam(p, mp_policy, layout) for p in params]
            self.mp_policy = mp_policy
        self._reduce_dtype = None

    def lazy_init(self) -> None:
        for p in self.fsdp_params:
            p.init_dtype_attrs(p.mp_policy)

    def unshard(self) -> None:
        for p in self.fsdp_params:
            p.unshard()


class FakeState:
    """``FSDPState`` (``_fsdp_state.py``): ``_fsdp_param_groups``, a list (2.13.0:67, 2.14.1:67,
    2.15.0:75); the module's policy ``_mp_policy`` (2.13.0:117, 2.14.1:117, 2.15.0:125, there
    without its override) and ``_cast_forward_inputs`` (2.13.0:346, 2.14.1:351, 2.15.0:372)."""

    def __init__(self, groups: list[FakeGroup], mp_policy: MixedPrecisionPolicy):
        self._fsdp_param_groups = groups
        self._mp_policy = mp_policy

    def _cast_forward_inputs(self, x: torch.Tensor) -> torch.Tensor:
        if not (self._mp_policy.cast_forward_inputs and self._mp_policy.param_dtype):
            return x
        return x.to(self._mp_policy.param_dtype) if x.is_floating_point() else x


class FakeFSDPModule(nn.Module):
    """A module ``fully_shard`` has wrapped: ``_get_fsdp_state()`` (``_fully_shard.py``
    2.13.0:881, 2.14.1:881, 2.15.0:1085)."""

    def __init__(self, state: FakeState):
        super().__init__()
        self.state = state

    def _get_fsdp_state(self) -> FakeState:
        return self.state


def _block(layout: str, policy: MixedPrecisionPolicy, override: Any = None,
           init: bool = True) -> FakeFSDPModule:
    weight = nn.Parameter(torch.randn(4, 4))
    norm = nn.Parameter(torch.ones(4))
    steps = nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False)
    group = FakeGroup([weight, norm, steps], policy, layout, override)
    if init:
        group.lazy_init()
        group.unshard()  # the job's pass: its bf16 buffers and unsharded parameters exist
    return FakeFSDPModule(FakeState([group], policy))


def _group(module: FakeFSDPModule) -> FakeGroup:
    return module.state._fsdp_param_groups[0]


TITAN = MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=F32)
"""TorchTitan's FSDP policy (``mixed_precision_param`` bfloat16, ``_reduce`` float32)."""
OVERRIDES = "param_dtype_override_fn" in {f.name for f in dataclasses.fields(TITAN)}
"""This torch resolves the policy per parameter (2.15)."""


# -- the job's dtype --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("init", [True, False], ids=["initialized", "before-lazy-init"])
def test_the_job_computes_in_the_policys_param_dtype_on_every_layout(layout: str,
                                                                      init: bool) -> None:
    model = nn.Sequential(_block(layout, TITAN, init=init), _block(layout, TITAN))
    assert fsdp.is_fsdp([model])
    assert fsdp.compute_dtype([model]) == BF16


@pytest.mark.parametrize("layout", LAYOUTS)
def test_float32_and_no_policy_compute_in_float32(layout: str) -> None:
    for policy in (MixedPrecisionPolicy(), MixedPrecisionPolicy(param_dtype=F32)):
        assert fsdp.compute_dtype([_block(layout, policy)]) == F32


def test_a_2_15_override_keeping_some_parameters_float32_leaves_the_job_bf16() -> None:
    """2.15's ``param_dtype_override_fn`` keeps the 1-D parameter in float32: the job still
    computes its GEMMs in bf16, the least precise of its parameters' dtypes."""
    keep_norms = lambda p: p.dtype if p.dim() == 1 else None  # noqa: E731
    block = _block("2.15.0", TITAN, override=keep_norms)
    weight, norm, _ = _group(block).fsdp_params
    assert (weight.param_dtype, norm.param_dtype) == (BF16, None)
    assert fsdp.compute_dtype([block]) == BF16
    assert fsdp.compute_dtype([_block("2.15.0", TITAN, override=lambda p: p.dtype)]) == F32


def test_no_fsdp_no_dtype() -> None:
    assert not fsdp.is_fsdp([nn.Linear(2, 2)])
    assert fsdp.compute_dtype([nn.Linear(2, 2)]) is None
    assert fsdp.param_groups([nn.Linear(2, 2)]) == []


def test_a_state_shared_by_grouped_modules_is_counted_once() -> None:
    """``fully_shard([a, b])`` gives both modules one state: its group is raised once."""
    shared = _block("2.15.0", TITAN).state
    model = nn.Sequential(FakeFSDPModule(shared), FakeFSDPModule(shared))
    assert len(fsdp.fsdp_states([model])) == 1 and len(fsdp.param_groups([model])) == 1


# -- raising for the reference pass -----------------------------------------------------------


def _job_state(group: FakeGroup) -> list[tuple[Any, ...]]:
    return [(p.param_dtype, p.reduce_dtype, id(p.all_gather_outputs),
             [id(t) for t in p.all_gather_outputs], id(getattr(p, "_unsharded_param", None)))
            for p in group.fsdp_params]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_only_the_given_blocks_are_raised_and_everything_is_put_back(layout: str) -> None:
    first, second = _block(layout, TITAN), _block(layout, TITAN)
    model = nn.Sequential(first, second)
    before = [_job_state(_group(b)) for b in (first, second)]
    job_buffers = [p.all_gather_outputs[0] for p in _group(first).fsdp_params]
    with fsdp.raised_to_sharded_dtype([first]):
        _group(first).unshard()
        _group(second).unshard()
        raised, kept = _group(first).fsdp_params, _group(second).fsdp_params
        assert all(p.param_dtype is None and p.reduce_dtype is None for p in raised)
        assert [p._unsharded_param.dtype for p in raised] == [F32, F32, torch.int64]
        floating = zip(raised[:2], job_buffers[:2], strict=True)  # int64 keeps its own
        assert all(p.all_gather_outputs[0] is not b for p, b in floating)
        assert [p._unsharded_param.dtype for p in kept] == [BF16, BF16, torch.int64]
        assert fsdp.compute_dtype([model]) == BF16  # the job's, not the pass's
        x = torch.ones(2, dtype=BF16)
        assert first.state._cast_forward_inputs(x).dtype == F32  # the other's output, widened
        assert second.state._cast_forward_inputs(x.float()).dtype == BF16
    assert [_job_state(_group(b)) for b in (first, second)] == before
    assert first.state._mp_policy is second.state._mp_policy is TITAN


def test_the_job_state_is_put_back_when_the_pass_fails() -> None:
    block = _block("2.15.0", TITAN)
    before = _job_state(_group(block))
    with pytest.raises(ValueError, match="pass failed"), fsdp.raised_to_sharded_dtype([block]):
        _group(block).unshard()
        raise ValueError("pass failed")
    assert _job_state(_group(block)) == before


def test_raising_before_fsdps_lazy_init_is_refused_when_it_would_lower() -> None:
    with pytest.raises(fsdp.FSDPLayoutError, match="no forward has run"):
        with fsdp.raised_to_sharded_dtype([_block("2.15.0", TITAN, init=False)]):
            pass
    with fsdp.raised_to_sharded_dtype([_block("2.15.0", MixedPrecisionPolicy(), init=False)]):
        pass  # float32 throughout: nothing to raise


def test_a_torch_without_swappable_all_gather_buffers_is_refused_in_one_sentence() -> None:
    block = _block("2.13.0", TITAN)
    for p in _group(block).fsdp_params:
        p.all_gather_outputs = None
    before = [(p.param_dtype, p.reduce_dtype) for p in _group(block).fsdp_params]
    with pytest.raises(fsdp.FSDPLayoutError, match="--training.mixed_precision_param float32"):
        with fsdp.raised_to_sharded_dtype([block]):
            pass
    assert [(p.param_dtype, p.reduce_dtype) for p in _group(block).fsdp_params] == before


@pytest.mark.parametrize("drop", ["groups", "param policy", "state policy"])
def test_a_layout_this_module_does_not_know_is_refused_not_read_as_float32(drop: str) -> None:
    block = _block("2.15.0", TITAN)
    if drop == "groups":
        del block.state._fsdp_param_groups
    elif drop == "param policy":
        del _group(block).fsdp_params[0].mp_policy
    else:
        del block.state._mp_policy
    refused = r"titan-rocm reads FSDP2 as torch 2\.13"
    if drop != "state policy":
        with pytest.raises(fsdp.FSDPLayoutError, match=refused):
            fsdp.compute_dtype([block])
    if drop != "param policy":  # after FSDP's lazy init the raise reads param_dtype instead
        with pytest.raises(fsdp.FSDPLayoutError, match=refused):
            with fsdp.raised_to_sharded_dtype([block]):
                pass


def test_the_audit_reads_the_job_dtype_through_this_module() -> None:
    """The audit's compute dtype of a 2.15-layout bf16 FSDP model (no autocast): FSDP's; a
    layout it cannot read is the sentence, never float32."""
    from titan_rocm.numerics.audit import Audit
    from titan_rocm.numerics.record import BlockRecord
    from titan_rocm.numerics.stats import AuditSettings

    block = _block("2.15.0", TITAN)
    record = BlockRecord("0", block, None, [torch.zeros(2, 2)], [True], None, [])
    audit = Audit([block], torch.device("cpu"), None, AuditSettings())
    assert audit._compute_dtype({"0": record}) == BF16
    del block.state._fsdp_param_groups
    with pytest.raises(fsdp.FSDPLayoutError, match="_fsdp_param_groups"):
        audit._compute_dtype({"0": record})


# -- the real fully_shard, two gloo ranks -----------------------------------------------------


def _fsdp_worker(rank: int, store_path: str, out_dir: str) -> None:
    """One of two gloo ranks: a two-block model under TorchTitan's bf16 policy (blocks and
    root each ``fully_shard``-ed); the dtypes each block computes in with the second block
    raised, with all raised (gradients against a float32 copy), and after; the job's
    buffers' identity kept. On a torch with ``param_dtype_override_fn`` (2.15), a block that
    keeps its norm in float32 too. Writes this rank's findings as JSON."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=2)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
        plain = copy.deepcopy(model)
        mesh = init_device_mesh("cpu", (2,))
        blocks = (model[0], model[2])
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=TITAN)
        fully_shard(model, mesh=mesh, mp_policy=TITAN)
        out: dict[str, Any] = {"before_init": str(fsdp.compute_dtype([model]))}
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))  # same on both
        seen: list[str] = []
        for block in blocks:  # after FSDP's hooks: the dtypes the block computes in
            block.register_forward_pre_hook(
                lambda m, args: seen.append(f"{args[0].dtype} {m.weight.dtype}"))

        def step() -> list[str]:
            seen.clear()
            model.zero_grad(set_to_none=True)
            model(x).float().square().sum().backward()
            return list(seen)

        out["job"] = step()
        out["job_dtype"] = str(fsdp.compute_dtype([model]))
        buffers = [(id(p), [id(t) for t in p.all_gather_outputs],
                    id(getattr(p, "_unsharded_param", None)), str(p.param_dtype))
                   for g in fsdp.param_groups([model]) for p in g.fsdp_params]
        with fsdp.raised_to_sharded_dtype([model[2]]):
            out["second_raised"] = step()
        with fsdp.raised_to_sharded_dtype([model]):
            out["all_raised"] = step()
            grads = [p.grad.full_tensor() for p in model.parameters()]
        plain(x).square().sum().backward()
        out["raised_error"] = max(float((g - p.grad).norm() / p.grad.norm())
                                  for g, p in zip(grads, plain.parameters(), strict=True))
        step()
        grads = [p.grad.full_tensor() for p in model.parameters()]
        out["job_error"] = max(float((g - p.grad).norm() / p.grad.norm())
                               for g, p in zip(grads, plain.parameters(), strict=True))
        out["after"] = step()
        out["buffers_kept"] = buffers == [
            (id(p), [id(t) for t in p.all_gather_outputs],
             id(getattr(p, "_unsharded_param", None)), str(p.param_dtype))
            for g in fsdp.param_groups([model]) for p in g.fsdp_params]
        if OVERRIDES:
            keep_bias = dataclasses.replace(
                TITAN, param_dtype_override_fn=lambda p: p.dtype if p.dim() == 1 else None)
            other = fully_shard(nn.Linear(16, 16), mesh=mesh, mp_policy=keep_bias)
            other.unshard()  # FSDP's lazy init (a forward would mix bf16 and float32 here)
            other.reshard()
            out["override"] = [str(fsdp.compute_dtype([other]))] + [
                str(p.param_dtype) for g in fsdp.param_groups([other]) for p in g.fsdp_params]
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))


@pytest.mark.slow
def test_real_fully_shard_on_two_gloo_ranks(tmp_path: Path) -> None:
    """The job's dtype before and after FSDP's lazy init; a raised block computes in float32
    (and only it, its input widened), all raised give float32-exact gradients where the job's
    are bf16-rounded; the job's buffers and unsharded parameters are the same objects after."""
    import torch.multiprocessing as mp

    mp.spawn(_fsdp_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out["before_init"] == out["job_dtype"] == "torch.bfloat16", out
        bf16, f32 = "torch.bfloat16 torch.bfloat16", "torch.float32 torch.float32"
        assert out["job"] == out["after"] == [bf16, bf16], out
        assert out["second_raised"] == [bf16, f32], out  # its bf16 input widened
        assert out["all_raised"] == [f32, f32], out
        assert out["raised_error"] < 1e-5 < 1e-3 < out["job_error"], out
        assert out["buffers_kept"], out
        if OVERRIDES:  # torch 2.15: the bias kept float32, the weight bf16
            assert out["override"] == ["torch.bfloat16", "torch.bfloat16", "None"], out
        else:
            assert "override" not in out
