"""The audit's statistics: per-parameter errors of the job's and the eager gradient against
the high-precision reference, reduced over ranks, and the verdict (docs/numerics-audit.md).

For one parameter with job gradient ``a``, eager gradient ``b`` and reference ``c`` (all
read as float64; a sharded parameter contributes its local shard on every rank):

* ``err_job = rmse(a, c) / rms(c)`` and ``err_eager = rmse(b, c) / rms(c)``;
* ``floor = floor_eps x eps(dtype of the job's gradient)``: the relative error a gradient
  stored in that dtype is allowed whatever eager does (on CPU the job runs float32, where
  eager and compiled agree to a few ulps and ``err_eager`` alone would make every reordered
  reduction an alarm). It is the gradient's dtype (float32 under AMP or FSDP's float32
  reduce), not the compute dtype: a bf16 floor (64 x 2^-7 = 0.5) would hide any error under
  50 %, which is what the first H200 run of the injected fault showed (a 38x ratio passed);
  the loss, computed in at least float32 by TorchTitan, gets the float32 floor;
* ``ratio = err_job / max(err_eager, floor)``: flagged above ``fudge``;
* ``outlier_fraction``: the fraction of elements with ``|a - c| > k x max(q-quantile of
  |b - c|, floor x rms(c))``: flagged above ``outlier_max``. "A few percent garbage" moves
  the RMSE of a large tensor little but puts that few percent above the eager error's
  tail.

Reductions: sums of squares, counts and maxima are all-reduced over the default process group
(when one is initialised), so every rank computes the same numbers and the same verdict. Each
element counts once: a DTensor dimension placed ``Replicate`` is counted by one rank of it,
a ``Partial`` one is reduced first (``_counted``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

QUANTILE_SAMPLE = 1 << 20
"""Elements of ``|b - c|`` a shard's quantile is taken over (a strided sample above this)."""


@dataclass(frozen=True)
class AuditSettings:
    """The statistic settings of one audit (``[rocm] numerics_audit_*``)."""

    fudge: float = 8.0
    """Flag when err_job exceeds fudge x max(err_eager, floor)."""
    floor_eps: float = 64.0
    """The dtype floor, in units of the job dtype's machine epsilon."""
    outlier_k: float = 10.0
    """An element is an outlier when its job error exceeds k x the eager error's quantile."""
    outlier_quantile: float = 0.999
    """That quantile of the eager error ``|b - c|``."""
    outlier_max: float = 1e-3
    """Flag when more than this fraction of a parameter's elements are outliers."""

    def __post_init__(self) -> None:
        for name in ("fudge", "floor_eps", "outlier_k", "outlier_max"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"numerics_audit_{name} = {value!r} is not valid; "
                                 "accepted: a finite number > 0")
        q = self.outlier_quantile
        if not (isinstance(q, (int, float)) and 0 < q < 1):
            raise ValueError(f"numerics_audit_outlier_quantile = {q!r} is not valid; "
                             "accepted: a number between 0 and 1 (exclusive)")

    @classmethod
    def of(cls, settings: Any) -> AuditSettings:
        """The audit settings of a :class:`~titan_rocm.settings.RocmSettings` (or any object
        with ``numerics_audit_<name>`` attributes; missing ones keep their default)."""
        values = {}
        for name in cls.__dataclass_fields__:
            value = getattr(settings, f"numerics_audit_{name}", None)
            if value is not None:
                values[name] = value
        return cls(**values)

    def to_dict(self) -> dict[str, float]:
        """The settings as JSON-ready numbers."""
        return {k: float(v) for k, v in asdict(self).items()}


def dtype_eps(dtype: torch.dtype) -> float:
    """Machine epsilon of a floating dtype."""
    return float(torch.finfo(dtype).eps)


@dataclass
class ParamStats:
    """One parameter's audit numbers (global over ranks) and its verdict."""

    name: str
    numel: int
    err_job: float
    err_eager: float
    ratio: float
    max_abs: float
    outlier_fraction: float
    flagged: bool
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite numbers become strings: JSON has no NaN)."""
        return {k: json_number(v) if isinstance(v, float) else v
                for k, v in asdict(self).items()}


def json_number(value: float) -> float | str:
    """``value``, or its name ("nan", "inf") when JSON cannot hold it."""
    return value if math.isfinite(value) else str(value)


def _sample(x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1)
    if flat.numel() > QUANTILE_SAMPLE:
        flat = flat[:: flat.numel() // QUANTILE_SAMPLE + 1]
    return flat


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    """A DTensor's local shard (each rank compares what it holds), else the tensor."""
    if t is None:
        return None
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _counted(t: torch.Tensor | None) -> torch.Tensor | None:
    """What this rank adds to the all-reduced sums for gradient ``t``: each element once.

    A DTensor's local shard, except that a ``Replicate`` mesh dimension (TP's norm and
    replicated weights, HSDP's replicate dimension) is counted by its coordinate-0 rank only
    (the others add an empty tensor), and a ``Partial`` one is reduced first (a partial sum
    is not the gradient). A plain tensor is counted as it is on every rank."""
    if t is None:
        return None
    placements = getattr(t, "placements", None)
    if placements is None:
        return t
    if any(p.is_partial() for p in placements):
        from torch.distributed.tensor import Replicate

        t = t.redistribute(t.device_mesh,
                           [Replicate() if p.is_partial() else p for p in placements])
        placements = t.placements
    local = t.to_local()
    coordinate = t.device_mesh.get_coordinate()
    if coordinate is None:  # this rank is not in the tensor's mesh: it holds nothing
        return local.reshape(-1)[:0]
    if any(p.is_replicate() and coordinate[dim] != 0 for dim, p in enumerate(placements)):
        return local.reshape(-1)[:0]
    return local


def _all_reduce(t: torch.Tensor, op: str) -> torch.Tensor:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    return t


def compare(
    names: Sequence[str],
    job: Mapping[str, torch.Tensor | None],
    eager: Mapping[str, torch.Tensor | None],
    reference: Mapping[str, torch.Tensor | None],
    job_dtype: torch.dtype,
    settings: AuditSettings,
    device: torch.device | str = "cpu",
) -> list[ParamStats]:
    """Every parameter's statistics and verdict (collective: every rank must call it with the
    same ``names``, in the same order)."""
    n = len(names)
    floors = [settings.floor_eps * dtype_eps(_grad_dtype(job.get(name), job_dtype))
              for name in names]
    # Phase 1, per parameter: [sum c^2, sum (a-c)^2, sum (b-c)^2, numel, missing] and maxima
    # [max |a-c|, eager quantile, non-finite].
    sums = torch.zeros(n, 5, dtype=torch.float64, device=device)
    maxima = torch.zeros(n, 3, dtype=torch.float64, device=device)
    diffs: list[tuple[torch.Tensor, torch.Tensor] | None] = []
    for i, name in enumerate(names):
        a, b, c = (_counted(d.get(name)) for d in (job, eager, reference))
        if a is None or b is None or c is None:
            # No gradient at all (an unused parameter) is fine; in some passes only is not.
            sums[i, 4] = 0.0 if a is None and b is None and c is None else 1.0
            diffs.append(None)
            continue
        c64 = c.detach().to(device=device, dtype=torch.float64)
        da = (a.detach().to(device=device, dtype=torch.float64) - c64).abs()
        db = (b.detach().to(device=device, dtype=torch.float64) - c64).abs()
        sums[i, 0] = c64.square().sum()
        sums[i, 1] = da.square().sum()
        sums[i, 2] = db.square().sum()
        sums[i, 3] = c64.numel()
        if da.numel():
            finite = bool(torch.isfinite(da).all())
            maxima[i, 0] = da.max() if finite else 0.0
            maxima[i, 2] = 0.0 if finite else 1.0
            maxima[i, 1] = torch.quantile(_sample(db), settings.outlier_quantile)
        diffs.append((da, db))
    _all_reduce(sums, "SUM")
    _all_reduce(maxima, "MAX")
    thresholds = torch.zeros(n, dtype=torch.float64, device=device)
    for i in range(n):
        count = float(sums[i, 3])
        rms = math.sqrt(float(sums[i, 0]) / count) if count else 0.0
        thresholds[i] = settings.outlier_k * max(float(maxima[i, 1]), floors[i] * rms)
    outliers = torch.zeros(n, dtype=torch.float64, device=device)
    for i, pair in enumerate(diffs):
        if pair is not None:
            outliers[i] = (pair[0] > thresholds[i]).sum()
    _all_reduce(outliers, "SUM")
    return [_verdict(names[i], sums[i].tolist(), maxima[i].tolist(), float(outliers[i]),
                     floors[i], settings) for i in range(n)]


def _grad_dtype(grad: torch.Tensor | None, fallback: torch.dtype) -> torch.dtype:
    """The dtype a job gradient is stored in (its local shard's), ``fallback`` without one."""
    local = _local(grad)
    return local.dtype if local is not None and local.is_floating_point() else fallback


def _verdict(name: str, sums: list[float], maxima: list[float], outliers: float,
             floor: float, settings: AuditSettings) -> ParamStats:
    ss_ref, ss_job, ss_eager, count, missing = sums
    max_abs, _, non_finite = maxima
    numel = int(count)
    if missing:
        return ParamStats(name, numel, math.nan, math.nan, math.nan, math.nan, math.nan, True,
                          "a gradient in some passes only (None in the others)")
    if not numel:
        return ParamStats(name, 0, 0.0, 0.0, 0.0, 0.0, 0.0, False, None)
    # A zero reference gradient: errors are taken against the floor's scale instead.
    denom = math.sqrt(ss_ref) if ss_ref > 0 else math.sqrt(count) * floor
    err_job = math.sqrt(ss_job) / denom if denom else 0.0
    err_eager = math.sqrt(ss_eager) / denom if denom else 0.0
    ratio = err_job / max(err_eager, floor)
    fraction = outliers / count
    reason = None
    if non_finite:
        reason = "non-finite values in the job's gradient"
        err_job = ratio = max_abs = math.inf
    elif ratio > settings.fudge:
        reason = (f"rmse {err_job:.3g} is {ratio:.3g} x max(eager {err_eager:.3g}, "
                  f"floor {floor:.3g}) > {settings.fudge:g}")
    elif fraction > settings.outlier_max:
        reason = (f"{fraction:.2%} of elements are off by more than {settings.outlier_k:g} x "
                  f"the eager error's {settings.outlier_quantile:g} quantile "
                  f"(> {settings.outlier_max:.2%})")
    return ParamStats(name, numel, err_job, err_eager, ratio, max_abs, fraction,
                      reason is not None, reason)


def loss_verdict(job: float, eager: float, reference: float, job_dtype: torch.dtype,
                 settings: AuditSettings) -> dict[str, Any]:
    """The loss judged as a parameter is: relative errors against the reference, ``fudge``."""
    floor = settings.floor_eps * dtype_eps(torch.promote_types(job_dtype, torch.float32))
    scale = abs(reference) or 1.0
    err_job, err_eager = abs(job - reference) / scale, abs(eager - reference) / scale
    finite = math.isfinite(job)
    flagged = not finite or err_job > settings.fudge * max(err_eager, floor)
    return {"job": json_number(job), "eager": json_number(eager),
            "reference": json_number(reference), "err_job": json_number(err_job),
            "err_eager": json_number(err_eager), "flagged": flagged}
