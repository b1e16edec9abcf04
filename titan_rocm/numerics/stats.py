"""The audit's statistics, streamed chunk by chunk and reduced over ranks; the tests are in
docs/numerics-audit.md ("The statistics").

Chunks add sums and histograms on a fixed logarithmic grid, so no tensor is needed whole, ranks
merge by summing, and nothing waits for the device. A bin (4.4 % wide) bounds the outlier error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from titan_rocm.settings import check_number

BINS_PER_OCTAVE = 16
LOWEST_OCTAVE = -150
OCTAVES = 280
NBINS = OCTAVES * BINS_PER_OCTAVE + 1
SLICE = 1 << 24
"""Each slice costs some 60 kernel launches whatever its size; slices of 4M kept a GPU waiting on
the host over deepseek_v3 16B's 277M expert-gradient elements.
"""
WORKSPACE_BYTES = 16 * SLICE * 4
"""One slice's temporaries (about sixteen float32 slices), counted in the audit's memory
estimate."""
SAMPLE = 1 << 16
"""A strided sample: counting every element on a GPU serialises on a few hot bins."""

RTOL: dict[torch.dtype, float] = {
    torch.float16: 1e-3, torch.bfloat16: 1.6e-2, torch.float32: 1.3e-6, torch.float64: 1e-7,
}
"""``torch.testing``'s defaults (``torch/testing/_comparison.py`` ``_DTYPE_PRECISIONS``)."""

KINDS = ("output", "input_grad", "param_grad", "loss")
ACTIVATIONS = ("output", "input_grad")


@dataclass(frozen=True)
class AuditSettings:
    """The statistic settings of one audit (``[rocm] numerics_audit_*``)."""

    fudge: float = 3.0
    activation_fudge: float = 1.5
    """For a block's output and input gradient: the job and eager round the same activations, so
    their errors agree far more closely.
    """
    child_fudge: float = 2.0
    """For a block child's parameter gradients, compared alone, and (below) its output and input
    gradient: a child's compiled code and its eager replay start from the same recorded values,
    so their errors agree more closely still (docs/numerics-audit.md, the defaults).
    """
    child_activation_fudge: float = 1.2
    floor_eps: float = 64.0
    outlier_k: float = 10.0
    outlier_quantile: float = 0.999
    outlier_max: float = 1e-3

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            check_number(f"numerics_audit_{name}", getattr(self, name))

    @classmethod
    def of(cls, settings: Any) -> AuditSettings:
        """From a RocmSettings (or any object with ``numerics_audit_<name>``; missing ones keep
        defaults)."""
        values = {}
        for name in cls.__dataclass_fields__:
            value = getattr(settings, f"numerics_audit_{name}", None)
            if value is not None:
                values[name] = value
        return cls(**values)

    def multiplier(self, kind: str, module: str | None) -> float:
        """The fudge a tensor of ``kind`` is judged with: a block child's (``module``) or a
        block's, an activation's or a gradient's."""
        if module is not None:
            return self.child_activation_fudge if kind in ACTIVATIONS else self.child_fudge
        return self.activation_fudge if kind in ACTIVATIONS else self.fudge

    @property
    def floor(self) -> float:
        """The additive floor as a relative error."""
        return self.floor_eps * float(torch.finfo(torch.float32).eps)

    def to_dict(self) -> dict[str, float]:
        """The settings as JSON-ready numbers."""
        return {k: float(v) for k, v in asdict(self).items()}


def json_number(value: float) -> float | str:
    """``value``, or its name ("nan", "inf") when JSON cannot hold it."""
    return value if math.isfinite(value) else str(value)


@dataclass
class TensorStats:
    """One compared tensor's numbers (global over ranks and chunks) and its verdict."""
    name: str
    segment: str
    kind: str
    numel: int
    err_job: float
    err_eager: float
    ratio: float
    """err_job / err_eager (reported; the verdict uses :attr:`score`)."""
    score: float
    """err_job / (fudge x err_eager + floor): flagged above 1."""
    outlier_fraction: float
    max_abs: float
    flagged: bool
    reason: str | None
    module: str | None = None
    """The block's child compared on its own (``attention``, ``moe``, ...); None: the block
    or an outside segment as a whole."""

    @property
    def direction(self) -> str:
        """``forward`` for an output (or the loss), ``backward`` for a gradient."""
        return "forward" if self.kind in ("output", "loss") else "backward"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite numbers become strings: JSON has no NaN)."""
        row = {k: json_number(v) if isinstance(v, float) else v for k, v in asdict(self).items()}
        if row["module"] is None:
            del row["module"]  # a block's or outside segment's own tensor, as before children
        row["direction"] = self.direction
        return row


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _counted(t: torch.Tensor) -> torch.Tensor:
    """Each element counts once: a ``Replicate`` dimension by its coordinate-0 rank only, a
    ``Partial`` one reduced first (a partial sum is not the value).
    """
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


def bin_of(x: torch.Tensor) -> torch.Tensor:
    """Each value's bin on the grid (0: zero and below 2**-150; the top bin: above 2**130)."""
    x = torch.nan_to_num(x, nan=0.0, posinf=math.inf).clamp_min(0.0)
    index = torch.floor(torch.log2(x) * BINS_PER_OCTAVE) + (-LOWEST_OCTAVE * BINS_PER_OCTAVE + 1)
    return index.clamp(0, NBINS - 1).long()


def histogram(index: torch.Tensor) -> torch.Tensor:
    """How many of ``index`` fall in each bin.

    ``torch.histc`` over a fixed range reads nothing back to the host, where a GPU ``bincount``
    syncs twice; under deterministic algorithms ``histc`` refuses and ``bincount`` counts. Exact:
    a chunk of at most 2**24 elements fits float32's exact integers.
    """
    if index.numel() == 0:
        return torch.zeros(NBINS, dtype=torch.int64, device=index.device)
    if index.device.type != "cpu" and torch.are_deterministic_algorithms_enabled():
        return torch.bincount(index[index >= 0], minlength=NBINS)
    return torch.histc(index.float(), bins=NBINS, min=-0.5, max=NBINS - 0.5).long()


def bin_top(index: int) -> float:
    """The upper edge of bin ``index`` (0 for the lowest bin's lower edge)."""
    return 2.0 ** ((index - (-LOWEST_OCTAVE * BINS_PER_OCTAVE + 1) + 1) / BINS_PER_OCTAVE)


def first_bin_above(threshold: float) -> int:
    """The first bin whose values are all at least ``threshold``."""
    if threshold <= 0:
        return 1
    edge = math.ceil(math.log2(threshold) * BINS_PER_OCTAVE)
    return max(1, min(NBINS, edge + (-LOWEST_OCTAVE * BINS_PER_OCTAVE + 1)))


def quantile_of(histogram: torch.Tensor, q: float) -> float:
    """The ``q`` quantile of the values a histogram counts, at the top of its bin."""
    total = float(histogram.sum())
    if total <= 0:
        return 0.0
    cumulative = histogram.double().cumsum(0)
    index = int(torch.searchsorted(cumulative, torch.tensor(q * total, dtype=torch.float64,
                                                             device=cumulative.device)))
    return 0.0 if index == 0 else bin_top(min(index, NBINS - 1))


@dataclass
class _Acc:
    name: str
    segment: str
    kind: str
    rtol: float
    sums: torch.Tensor
    maxima: torch.Tensor
    eager_hist: torch.Tensor
    outlier_hist: torch.Tensor
    module: str | None = None
    missing: float = 0.0
    count: float = 0.0
    """Kept on the host: no chunk waits for the device to count."""


@dataclass
class Accumulator:
    """Streams the comparison of named tensors, then judges them all (:meth:`finish` is collective:
    every rank adds the same names in the same order).
    """

    settings: AuditSettings
    device: torch.device
    entries: dict[str, _Acc] = field(default_factory=dict)

    def _entry(self, name: str, segment: str, kind: str, rtol: float,
               module: str | None = None) -> _Acc:
        entry = self.entries.get(name)
        if entry is None:
            entry = _Acc(name, segment, kind, rtol,
                         torch.zeros(3, dtype=torch.float64, device=self.device),
                         torch.zeros(2, dtype=torch.float64, device=self.device),
                         torch.zeros(NBINS, dtype=torch.int64, device=self.device),
                         torch.zeros(NBINS, dtype=torch.int64, device=self.device), module)
            self.entries[name] = entry
        return entry

    def add(self, name: str, segment: str, kind: str, a: torch.Tensor | None,
            b: torch.Tensor | None, c: torch.Tensor | None, rtol: float,
            module: str | None = None) -> None:
        """Add one chunk (``a`` job, ``b`` eager, ``c`` reference). Float32 differences unless the
        reference is float64: a 16-bit job's 1e-3 errors need no more.
        """
        entry = self._entry(name, segment, kind, rtol, module)
        if a is None or b is None or c is None:
            if not (a is None and b is None and c is None):
                entry.missing = 1.0
            return
        a, b, c = (_counted(t).detach().reshape(-1) for t in (a, b, c))
        k = self.settings.outlier_k
        work = torch.float64 if c.dtype == torch.float64 else torch.float32
        for lo in range(0, c.numel(), SLICE):
            hi = min(c.numel(), lo + SLICE)
            cw = c[lo:hi].to(device=self.device, dtype=work)
            da = (a[lo:hi].to(device=self.device, dtype=work) - cw).abs()
            db = (b[lo:hi].to(device=self.device, dtype=work) - cw).abs()
            finite = torch.isfinite(da)
            da_finite = torch.where(finite, da, torch.zeros_like(da))
            db = torch.nan_to_num(db, nan=0.0, posinf=0.0)
            entry.sums += torch.stack([cw.square().sum(dtype=torch.float64),
                                       da_finite.square().sum(dtype=torch.float64),
                                       db.square().sum(dtype=torch.float64)])
            entry.count += hi - lo
            entry.maxima[0] = torch.maximum(entry.maxima[0], da_finite.max().double())
            entry.maxima[1] += (~finite).sum()
            stride = max(1, (hi - lo) // SAMPLE)
            entry.eager_hist += histogram(bin_of(db[::stride])) * stride
            # Only the outlier statistic's bins from 1 up are ever read (the threshold's first
            # bin is at least 1): elements the eager guard keeps out, and those in bin 0, are
            # left uncounted (index -1) rather than masked out, which would make the host
            # wait, or put in bin 0, where a GPU's histogram serialises on one counter.
            candidates = finite & (da > k * db)
            index = bin_of((da - rtol * cw.abs()) / k)
            entry.outlier_hist += histogram(torch.where(candidates & (index > 0), index, -1))

    def absorb(self, other: Accumulator) -> None:
        """Add what ``other`` gathered (a replay's own, merged once it has run whole)."""
        for name, theirs in other.entries.items():
            mine = self._entry(name, theirs.segment, theirs.kind, theirs.rtol, theirs.module)
            mine.sums += theirs.sums
            mine.count += theirs.count
            mine.maxima[0] = torch.maximum(mine.maxima[0], theirs.maxima[0])
            mine.maxima[1] += theirs.maxima[1]
            mine.eager_hist += theirs.eager_hist
            mine.outlier_hist += theirs.outlier_hist
            mine.missing = max(mine.missing, theirs.missing)

    def finish(self) -> list[TensorStats]:
        """Every tensor's statistics and verdict, reduced over ranks, in the order added."""
        entries = list(self.entries.values())
        if not entries:
            return []
        counts = torch.tensor([[e.count, e.missing] for e in entries], dtype=torch.float64,
                              device=self.device)
        sums = torch.cat([torch.stack([e.sums for e in entries]), counts], dim=1)
        maxima = torch.stack([e.maxima for e in entries])
        hists = torch.stack([torch.stack([e.eager_hist, e.outlier_hist]) for e in entries])
        _all_reduce(sums, "SUM")
        _all_reduce(maxima, "MAX")
        _all_reduce(hists, "SUM")
        sums_l, maxima_l, hists = sums.tolist(), maxima.tolist(), hists.cpu()
        return [self._verdict(e, sums_l[i], maxima_l[i], hists[i])
                for i, e in enumerate(entries)]

    def _verdict(self, e: _Acc, sums: Sequence[float], maxima: Sequence[float],
                 hists: torch.Tensor) -> TensorStats:
        s = self.settings
        ss_ref, ss_job, ss_eager, count, missing = sums
        max_abs, non_finite = maxima
        numel = int(count)
        floor = s.floor
        if missing:
            return TensorStats(e.name, e.segment, e.kind, numel, math.nan, math.nan, math.nan,
                               math.nan, math.nan, math.nan, True,
                               "a value in some passes only (None in the others)", e.module)
        if not numel:
            return TensorStats(e.name, e.segment, e.kind, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                               False, None, e.module)
        # A zero reference: errors are taken against the floor's scale instead.
        denom = math.sqrt(ss_ref) if ss_ref > 0 else math.sqrt(count) * floor
        err_job = math.sqrt(ss_job) / denom if denom else 0.0
        err_eager = math.sqrt(ss_eager) / denom if denom else 0.0
        fudge = s.multiplier(e.kind, e.module)
        limit = fudge * err_eager + floor
        score = err_job / limit
        ratio = err_job / err_eager if err_eager else (0.0 if not err_job else math.inf)
        rms = math.sqrt(ss_ref / count)
        threshold = max(quantile_of(hists[0], s.outlier_quantile), floor * rms)
        outliers = float(hists[1][first_bin_above(threshold):].sum())
        fraction = outliers / count
        reason = None
        if non_finite:
            reason = f"{int(non_finite)} non-finite value(s) in the job's"
            err_job = ratio = score = max_abs = math.inf
        elif score > 1:
            reason = (f"rmse {err_job:.3g} > {fudge:g} x eager {err_eager:.3g} + floor "
                      f"{floor:.2g} (ratio {ratio:.3g})")
        elif fraction > s.outlier_max:
            reason = (f"{fraction:.3%} of elements are off by more than {s.outlier_k:g} x "
                      f"the eager error's {s.outlier_quantile:g} quantile "
                      f"(> {s.outlier_max:.2%})")
        return TensorStats(e.name, e.segment, e.kind, numel, err_job, err_eager, ratio, score,
                           fraction, max_abs, reason is not None, reason, e.module)


def loss_stats(job: float, eager: float, reference: float, compute_dtype: torch.dtype,
               settings: AuditSettings, name: str = "loss",
               segment: str = "end to end") -> TensorStats:
    """The loss judged with the dtype's ``rtol`` as floor: one value's eager error can be near
    zero."""
    scale = abs(reference) or 1.0
    err_job, err_eager = abs(job - reference) / scale, abs(eager - reference) / scale
    floor = max(settings.floor, RTOL.get(compute_dtype, RTOL[torch.float32]))
    limit = settings.fudge * err_eager + floor
    ratio = err_job / err_eager if err_eager else (0.0 if not err_job else math.inf)
    finite = math.isfinite(job)
    flagged = not finite or err_job > limit
    reason = None
    if not finite:
        reason = "the job's loss is not finite"
    elif flagged:
        reason = (f"relative error {err_job:.3g} > {settings.fudge:g} x eager "
                  f"{err_eager:.3g} + {floor:.2g}")
    return TensorStats(name, segment, "loss", 1, err_job if finite else math.inf, err_eager,
                       ratio, err_job / limit if finite else math.inf, 0.0,
                       abs(job - reference) if finite else math.inf, flagged, reason)
