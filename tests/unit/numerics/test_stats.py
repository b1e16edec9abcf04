"""The audit's statistics (titan_rocm/numerics/stats.py) on synthetic tensors: the ratio test,
the outlier test, chunked streaming, DTensor placements over two gloo ranks, the histogram
grid, and the scalar loss rule."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from titan_rocm.numerics import stats
from titan_rocm.numerics.stats import Accumulator, AuditSettings, loss_stats
from titan_rocm.settings import RocmSettings

BF16 = stats.RTOL[torch.bfloat16]
F32 = stats.RTOL[torch.float32]


def _values(n: int = 200_000, noise: float = 1e-7, seed: int = 0) -> tuple[Any, Any, Any]:
    """(job, eager, reference): two independent errors of relative size ``noise``."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(n, generator=g, dtype=torch.float64)
    b = c + noise * torch.randn(n, generator=g, dtype=torch.float64)
    a = c + noise * torch.randn(n, generator=g, dtype=torch.float64)
    return a.float(), b.float(), c


def _one(a: Any, b: Any, c: Any, rtol: float = F32, chunks: int = 1, kind: str = "param_grad",
         module: str | None = None, **settings: Any) -> Any:
    acc = Accumulator(AuditSettings(**settings), torch.device("cpu"))
    edges = [round(i * a.numel() / chunks) for i in range(chunks + 1)]
    for lo, hi in zip(edges, edges[1:], strict=False):
        acc.add("w", "0", kind, a[lo:hi], b[lo:hi], c[lo:hi], rtol, module=module)
    return acc.finish()[0]


def test_clean_values_are_ok() -> None:
    t = _one(*_values())
    assert not t.flagged and t.reason is None
    assert t.score < 1 and t.outlier_fraction == 0.0 and t.numel == 200_000


def test_defaults() -> None:
    s = AuditSettings()
    assert (s.fudge, s.activation_fudge, s.child_fudge, s.child_activation_fudge, s.floor_eps,
            s.outlier_k, s.outlier_quantile, s.outlier_max) == (
        3.0, 1.5, 2.0, 1.2, 64.0, 10.0, 0.999, 1e-3)
    assert s.floor == pytest.approx(64 * 2**-23)


@pytest.mark.parametrize(("kind", "module", "fudge"), [
    ("param_grad", None, 3.0), ("output", None, 1.5), ("input_grad", None, 1.5),
    ("param_grad", "moe.router", 2.0), ("output", "attention", 1.2),
    ("input_grad", "moe", 1.2)])
def test_each_kind_is_judged_with_its_own_multiplier(kind: str, module: str | None,
                                                     fudge: float) -> None:
    """A block's parameter gradients with ``fudge``, its output and input gradient with
    ``activation_fudge``; a child's (``module``) with the children's own: an error 1.3 x the
    eager error is flagged by exactly the multipliers under 1.3."""
    a, b, c = _values(noise=4e-3)
    job = c + 1.3 * (b.double() - c)  # err_job = 1.3 x err_eager, far above the floor
    t = _one(job.float(), b, c, kind=kind, module=module)
    assert t.flagged == (fudge < 1.3), t
    if t.flagged:
        assert f"> {fudge:g} x eager" in t.reason
    assert t.score == pytest.approx(1.3 / fudge, rel=1e-2)
    assert AuditSettings().multiplier(kind, module) == fudge


@pytest.mark.parametrize("fraction", [0.005, 0.01, 0.03])
def test_garbage_in_a_few_elements_is_flagged(fraction: float) -> None:
    """Elements replaced by a neighbour's value (finite, in range), as the buffer-store hazard
    leaves them, against bfloat16-sized errors."""
    a, b, c = _values(noise=4e-3)
    picked = torch.rand(a.numel(), generator=torch.Generator().manual_seed(1)) < fraction
    a[picked] = a.roll(1)[picked]
    t = _one(a, b, c, rtol=BF16)
    assert t.flagged and "rmse" in t.reason
    assert t.outlier_fraction == pytest.approx(fraction, rel=0.25)


def test_outliers_the_rmse_dilutes_are_flagged() -> None:
    """0.5 % of elements off by 20 x the eager error's RMS: the RMSE grows by sqrt(1 + 0.005 x
    400) = 1.7, under the fudge of 3; 10 x the eager error's 0.999 quantile (about 33 x its
    RMS) is not enough for them, but with the quantile at 0.99 (k x 2.6 RMS) they stand out."""
    a, b, c = _values(noise=1e-3)
    picked = torch.rand(a.numel(), generator=torch.Generator().manual_seed(2)) < 0.005
    a = c.float() + (b - c.float())  # the same error as eager...
    a[picked] += 20e-3 * torch.sign(torch.randn(int(picked.sum())))  # ...plus the garbage
    t = _one(a, b, c, rtol=0.0, outlier_quantile=0.99, outlier_k=4.0)
    assert t.score < 1 and t.ratio < AuditSettings().fudge
    assert t.flagged and "of elements" in t.reason
    assert t.outlier_fraction == pytest.approx(0.005, rel=0.2)


def test_elements_eager_gets_as_wrong_are_not_outliers() -> None:
    """A MoE token routed to another expert at a near-tie moves the eager value as far as the
    job's: such elements are not counted (|a - c| must also exceed k x |b - c|)."""
    a, b, c = _values(noise=1e-3)
    tie = torch.zeros(a.numel(), dtype=torch.bool)
    tie[::200] = True  # 0.5 % of elements
    shift = torch.randn(int(tie.sum()), dtype=torch.float64)
    a[tie] = (c[tie] + shift).float()
    b[tie] = (c[tie] + shift * 0.9).float()
    t = _one(a, b, c, rtol=BF16)
    assert t.outlier_fraction == 0.0 and not t.flagged


@pytest.mark.parametrize("kind, flagged", [("output", True), ("input_grad", True),
                                           ("param_grad", False)])
def test_activations_are_judged_with_their_own_fudge(kind: str, flagged: bool) -> None:
    """A job error twice eager's (a dense fault the size of the rounding: a forward fault
    diluted by the GEMMs after it) is flagged on a block's output and input gradient, whose
    clean ratio is 1.000 to 1.005 on the H200 (docs/numerics-audit.md), and not on a
    parameter's gradient, whose clean ratio reaches 1.9."""
    a, b, c = _values(noise=4e-3)
    a = (c + 2 * (a.double() - c)).float()
    t = _one(a, b, c, rtol=BF16, kind=kind)
    assert 1.5 < t.ratio < 3
    assert t.flagged is flagged
    if flagged:
        assert t.reason.startswith("rmse ") and "> 1.5 x eager" in t.reason


def test_chunks_stream_to_the_whole_tensors_numbers() -> None:
    a, b, c = _values(n=50_000, noise=2e-3)
    a[::97] = a.roll(1)[::97]
    whole = _one(a, b, c, rtol=BF16)
    split = _one(a, b, c, rtol=BF16, chunks=7)
    for key in ("err_job", "err_eager", "ratio", "score", "outlier_fraction", "max_abs"):
        assert getattr(split, key) == pytest.approx(getattr(whole, key), rel=1e-9), key


def test_the_grid_quantile_and_count_are_within_a_bin() -> None:
    values = torch.logspace(-8, 2, 100_001, dtype=torch.float64)
    hist = torch.bincount(stats.bin_of(values), minlength=stats.NBINS)
    q = stats.quantile_of(hist, 0.5)
    assert q == pytest.approx(1e-3, rel=2 ** (1 / stats.BINS_PER_OCTAVE) - 1 + 1e-3)
    assert q >= 1e-3  # the top of its bin: never below the true quantile
    above = float(hist[stats.first_bin_above(1.0):].sum())
    at_least = int((values >= 1.0).sum())
    assert 0.99 * at_least <= above <= at_least  # whole bins from the threshold: never more
    assert stats.bin_of(torch.tensor([0.0, -1.0, math.nan])).tolist() == [0, 0, 0]
    assert int(stats.bin_of(torch.tensor([math.inf]))) == stats.NBINS - 1


def test_the_histogram_counts_every_bin_exactly_as_bincount() -> None:
    # Every edge of the grid (0, NBINS - 1) and a chunk's worth of one hot bin: histc's
    # float arithmetic must not move an index to its neighbour.
    generator = torch.Generator().manual_seed(0)
    index = torch.cat([torch.arange(stats.NBINS),
                       torch.randint(0, stats.NBINS, (200_000,), generator=generator),
                       torch.full((1 << 20,), stats.NBINS - 1)])
    assert torch.equal(stats.histogram(index), torch.bincount(index, minlength=stats.NBINS))
    assert stats.histogram(index[:0]).tolist() == [0] * stats.NBINS
    uncounted = torch.cat([index, torch.full((1000,), -1)])  # below the range: not counted
    assert torch.equal(stats.histogram(uncounted), stats.histogram(index))


def _placed_worker(rank: int, store_path: str, out_dir: str) -> None:
    """One of two gloo ranks: the same values as DTensors placed Shard(0), Replicate and
    Partial on a 2-rank mesh, compared; this rank's verdicts written as JSON."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    a, b, c = _values(n=4096, noise=1e-6)
    a[::50] = a.roll(1)[::50]  # 2 % garbage: flagged on the whole tensor
    expected = _one(a, b, c)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        placed: dict[str, dict[str, Any]] = {"job": {}, "eager": {}, "reference": {}}
        for kind, x in zip(placed, (a, b, c), strict=True):
            placed[kind]["shard"] = distribute_tensor(x, mesh, [Shard(0)])
            placed[kind]["replicate"] = distribute_tensor(x, mesh, [Replicate()])
            # Halves are exact in binary: the Partial sum over two ranks is x itself.
            placed[kind]["partial"] = DTensor.from_local(x * 0.5, mesh, [Partial()])
        # Garbage in rank 1's half only: both ranks must flag it.
        index = torch.arange(a.numel())
        one_half = torch.where((index % 50 == 0) & (index >= a.numel() // 2), a, b)
        placed["job"]["half"] = distribute_tensor(one_half, mesh, [Shard(0)])
        placed["eager"]["half"] = placed["eager"]["shard"]
        placed["reference"]["half"] = placed["reference"]["shard"]
        acc = Accumulator(AuditSettings(), torch.device("cpu"))
        for name in ("shard", "replicate", "partial", "half"):
            acc.add(name, "0", "param_grad", placed["job"][name], placed["eager"][name],
                    placed["reference"][name], F32)
        got = acc.finish()
    finally:
        dist.destroy_process_group()
    out = {"expected": expected.to_dict(), **{t.name: t.to_dict() for t in got}}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))


def test_dtensor_placements_count_each_element_once(tmp_path: Path) -> None:
    """Two gloo ranks: a tensor sharded, replicated or partial over the TP mesh gets the
    numbers the whole tensor gets in one process (a Replicate shard counted on both ranks
    would double numel; a Partial one compared unreduced would be another tensor)."""
    import torch.multiprocessing as mp

    mp.spawn(_placed_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        expected = out["expected"]
        assert expected["flagged"]
        for name in ("shard", "replicate", "partial"):
            got = out[name]
            assert got["numel"] == expected["numel"] == 4096, (name, got)
            assert got["flagged"] == expected["flagged"], (name, got)
            for key in ("err_job", "err_eager", "ratio", "max_abs", "outlier_fraction"):
                assert got[key] == pytest.approx(expected[key], rel=1e-9), (name, key)
        assert out["half"]["flagged"] and out["half"]["numel"] == 4096


def test_non_finite_and_missing_values_are_flagged() -> None:
    a, b, c = _values(1000)
    a[3] = float("nan")
    assert "non-finite" in _one(a, b, c).reason
    acc = Accumulator(AuditSettings(), torch.device("cpu"))
    acc.add("some", "0", "param_grad", None, b, c, F32)
    acc.add("unused", "0", "param_grad", None, None, None, F32)
    some, unused = acc.finish()
    assert some.flagged and "some passes only" in some.reason
    assert not unused.flagged and unused.numel == 0


def test_a_bf16_jobs_float32_values_are_judged_at_the_float32_floor() -> None:
    """A bf16 job keeps float32 gradients; its eager error is ~0.5 %. The floor is float32's
    (64 eps = 7.6e-6), so a gradient 4 x as wrong as eager is flagged: a floor in bfloat16
    units (64 x 2^-7 = 0.5) would pass anything under 50 %."""
    a, b, c = _values(noise=5e-3)
    wrong = c.float() + 4 * (a - c.float())
    t = _one(wrong, b, c, rtol=BF16)
    assert t.flagged and "rmse" in t.reason and t.ratio == pytest.approx(4, rel=0.05)
    assert not _one(a, b, c, rtol=BF16).flagged


def test_loss_rule_has_the_compute_dtypes_tolerance_as_floor() -> None:
    f = torch.float32
    assert not loss_stats(6.0 + 1e-6, 6.0, 6.0, f, AuditSettings()).flagged
    assert loss_stats(6.01, 6.0, 6.0, f, AuditSettings()).flagged
    # bfloat16: one value's eager error can be 0 by chance; 1e-3 relative is bf16's noise.
    assert not loss_stats(6.0 * (1 + 1e-3), 6.0, 6.0, torch.bfloat16, AuditSettings()).flagged
    assert loss_stats(6.0 * 1.05, 6.0, 6.0, torch.bfloat16, AuditSettings()).flagged
    assert loss_stats(math.nan, 6.0, 6.0, f, AuditSettings()).flagged


def test_settings_come_from_rocm_and_bad_values_name_what_is_accepted() -> None:
    s = AuditSettings.of(RocmSettings(numerics_audit_fudge=4.0))
    assert s.fudge == 4.0 and s.to_dict()["outlier_quantile"] == 0.999
    sentence = (r"\[rocm\] numerics_audit_outlier_quantile = 1.5 is not valid; accepted: a "
                r"number > 0 and < 1$")
    with pytest.raises(ValueError, match=sentence):  # one validator, one sentence
        AuditSettings(outlier_quantile=1.5)
    with pytest.raises(ValueError, match=sentence):
        RocmSettings(numerics_audit_outlier_quantile=1.5)
    for name in ("fudge", "activation_fudge", "child_fudge", "child_activation_fudge",
                 "floor_eps", "outlier_k", "outlier_max"):
        with pytest.raises(ValueError, match=rf"numerics_audit_{name} = nan is not valid; "
                                             r"accepted: a number > 0 and <= "):
            AuditSettings(**{name: math.nan})
    with pytest.raises(ValueError, match=r"numerics_audit_fudge = -1 .*a number > 0"):
        RocmSettings(numerics_audit_fudge=-1)
    with pytest.raises(ValueError, match=r"numerics_audit_every = 0 .*an integer >= 1"):
        RocmSettings(numerics_audit_every=0)
    with pytest.raises(ValueError, match="numerics_audit = 'always'.*first_step"):
        RocmSettings(numerics_audit="always")
    with pytest.raises(ValueError, match="numerics_audit_reference = 'fp128'.*tf32"):
        RocmSettings(numerics_audit_reference="fp128")
