"""The numerics audit of one micro-batch: block by block, teacher-forced (docs/numerics-audit.md).

1. **The job pass** is the trainer's own step on the micro-batch, compiled, at the job's
   precision, with every converter: in ``titan-rocm audit`` a step run for the audit, inside
   training the step itself. A :class:`~titan_rocm.numerics.record.Recorder` on the block
   boundaries keeps each block's inputs and outputs and the gradients that arrived at them.
2. **Replays**, one block at a time: eager at the job's precision, then eager in high
   precision (:mod:`.precision`), each from the job's own inputs of that block and the job's
   own gradient at its outputs (:func:`~titan_rocm.numerics.replay.replay_block`), in runs of
   whole rows where memory asks. Compared per block: each output, the gradient at each input,
   each parameter's gradient. The parts outside the blocks are replayed by the trainer's own
   step with every block standing in as what the job computed
   (:class:`~titan_rocm.numerics.replay.StandIn`): the embedding's output and parameters,
   and the head's loss, input gradient and parameters.
3. **End to end**: the loss of forward-only eager and high-precision passes of the whole
   model against the job's.

A wrong kernel in block k then shows in block k alone: its forward output when the kernel is
in the forward, its gradients when in the backward. :attr:`AuditResult.first_wrong` names the
first segment wrong in each direction. Because each block is judged on its own, an audit can
be spread over consecutive steps (:func:`spread`): each step replays a :class:`Part` of the
blocks, and the last one the parts outside the blocks and the end-to-end loss.

Everything is given back: every parameter's ``.grad`` (the job's tensors themselves), every
RNG stream, every buffer's value, FSDP's dtypes and buffers; nothing is stepped or written.
The generation-specific parts (the step, a forward-only loss, the switch to the reference's
arithmetic) come from the caller as a :class:`StepKit`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.numbers import Bounds
from titan_rocm.numerics import blocks, fsdp, precision
from titan_rocm.numerics.attribution import (
    EMBEDDING,
    HEAD,
    JobFacts,
    Segment,
    clean_name,
    segments,
)
from titan_rocm.numerics.held_precision import HeldPrecision
from titan_rocm.numerics.record import BlockRecord, Recorder, RecordError, recorder_for
from titan_rocm.numerics.replay import StandIn, cut, replay_block, rows_of, sliceable
from titan_rocm.numerics.stats import (
    RTOL,
    WORKSPACE_BYTES,
    Accumulator,
    AuditSettings,
    TensorStats,
    json_number,
    loss_stats,
)

SCHEMA = 2
"""Version of :meth:`AuditResult.to_dict`'s layout (keys are only ever added within one)."""

EAGER_FACTOR = 3.0
"""Eager replays keep about this many times what the compiled block saved (unfused
intermediates); only the first block's estimate uses it: later blocks use what the first
one measured."""

Batch = tuple[dict[str, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Part:
    """What one step of an audit spread over steps replays (``numerics_audit_spread``)."""

    index: int
    """1-based, in the order the steps run them."""
    count: int
    """Parts of the whole audit."""
    blocks: tuple[str, ...]
    """The ``model.layers`` keys replayed, in forward order."""
    outside: bool
    """The parts outside the blocks (embedding, head) and the end-to-end loss."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``part``, ``of``, ``blocks``, ``outside``."""
        return {"part": self.index, "of": self.count, "blocks": list(self.blocks),
                "outside": self.outside}


def spread(keys: list[str], steps: int) -> list[Part]:
    """The parts of an audit of the blocks ``keys`` spread over ``steps`` steps.

    One step: one part with everything. ``steps >= 2``: the blocks dealt into
    ``min(steps - 1, len(keys))`` parts (block ``i`` into part ``i mod n``, so that a model
    whose blocks differ, dense ones then MoE ones, costs about the same each step), then one
    part with the parts outside the blocks and the end-to-end loss, whose logits over the
    vocabulary cost about as much as a share of the blocks.
    """
    if steps <= 1 or not keys:
        return [Part(1, 1, tuple(keys), True)]
    n = min(steps - 1, len(keys))
    return [*(Part(j + 1, n + 1, tuple(keys[j::n]), False) for j in range(n)),
            Part(n + 1, n + 1, (), True)]


class StepKit(Protocol):
    """A TorchTitan generation's step on one micro-batch, its loss denominator fixed."""

    def run(self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        """Forward and backward as the trainer runs them; returns the loss."""

    def forward(self, input_dict: dict[str, torch.Tensor],
                labels: torch.Tensor) -> torch.Tensor:
        """The same loss, forward only (called under ``torch.no_grad``)."""

    def reference(self) -> contextlib.AbstractContextManager[Any]:
        """The trainer's own switches for the reference's arithmetic (its autocast off)."""


class AuditError(RuntimeError):
    """The audit cannot run (the message is one sentence saying why): exit 2, or a skip."""


@dataclass
class AuditResult:
    """What one audit found; :meth:`to_dict` is the ``--json`` object."""

    world_size: int
    tokens: int
    job_dtype: str
    reference: str
    settings: AuditSettings
    segments: list[Segment]
    """The segments this audit compared, in forward order."""
    tensors: list[TensorStats]
    loss: TensorStats | None
    """The end-to-end loss: the job's against whole-model eager and reference passes (None
    in a part of a spread audit that does not compare it)."""
    loss_values: dict[str, float]
    """The three end-to-end losses (job, eager, reference); empty where not compared."""
    time_s: dict[str, float]
    peak_memory_bytes: int | None
    memory: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    chunks: int = 1
    """Runs of rows each block's replays took."""
    outside_chunks: int = 1
    """Runs of rows the parts outside the blocks took."""
    applied: list[str] = field(default_factory=list)
    part: Part | None = None
    """What this step replayed of an audit spread over steps (None: the whole audit)."""

    @property
    def flagged(self) -> bool:
        """Any compared tensor or the end-to-end loss flagged."""
        return (self.loss is not None and self.loss.flagged) or any(
            t.flagged for t in self.tensors)

    def first_wrong(self, direction: str) -> Segment | None:
        """The first segment wrong in ``direction``: forward, in forward order; backward, in
        backward order (the head first)."""
        order = self.segments if direction == "forward" else list(reversed(self.segments))
        wrong = {t.segment for t in self.tensors if t.flagged and t.direction == direction}
        return next((s for s in order if s.name in wrong), None)

    def segment_rows(self) -> list[dict[str, Any]]:
        """Per segment: its facts, and per direction whether it is wrong, its worst score and
        the flagged tensors."""
        rows = []
        for s in self.segments:
            row = s.to_dict()
            for direction in ("forward", "backward"):
                mine = [t for t in self.tensors if t.segment == s.name
                        and t.direction == direction]
                scores = [t.score for t in mine if not math.isnan(t.score)]
                row[direction] = {"flagged": [t.name for t in mine if t.flagged],
                                  "worst_score": json_number(max(scores)) if scores else 0.0,
                                  "tensors": len(mine)}
            rows.append(row)
        return rows

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object (schema 2), with an ``exit_code`` of 0 (ok) or 1 (flagged)."""
        flagged = self.flagged
        first = {d: (s.name if (s := self.first_wrong(d)) else None)
                 for d in ("forward", "backward")}
        return {
            "schema": SCHEMA, "command": "audit", "verdict": "flagged" if flagged else "ok",
            "exit_code": 1 if flagged else 0, "error": None,
            "world_size": self.world_size, "tokens": self.tokens,
            "job_dtype": self.job_dtype, "reference": self.reference,
            "settings": self.settings.to_dict(), "first_wrong": first,
            "loss": None if self.loss is None else {
                **self.loss.to_dict(), **{k: json_number(v) for k, v in self.loss_values.items()}},
            "segments": self.segment_rows(),
            "tensors": [t.to_dict() for t in self.tensors],
            "workarounds_applied": self.applied, "time_s": self.time_s,
            "peak_memory_bytes": self.peak_memory_bytes, "memory": self.memory,
            "chunks": self.chunks, "outside_chunks": self.outside_chunks,
            "notes": self.notes, "part": None if self.part is None else self.part.to_dict(),
        }


def error_dict(message: str, world_size: int = 1) -> dict[str, Any]:
    """The ``--json`` object of an audit that could not run (exit 2): every key, empty."""
    return {
        "schema": SCHEMA, "command": "audit", "verdict": "error", "exit_code": 2,
        "error": message, "world_size": world_size, "tokens": 0, "job_dtype": None,
        "reference": None, "settings": {}, "first_wrong": {"forward": None, "backward": None},
        "loss": None, "segments": [], "tensors": [], "workarounds_applied": [], "time_s": {},
        "peak_memory_bytes": None, "memory": {}, "chunks": 0, "outside_chunks": 0,
        "notes": [], "part": None,
    }


# ---------------------------------------------------------------- micro-batches


def cut_batch(input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
              cut_rows: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    """``cut_rows`` applied to the labels and every input tensor that has their batch rows."""
    batch = labels.shape[0]

    def one(t: Any) -> Any:
        return cut_rows(t) if isinstance(t, torch.Tensor) and t.shape[:1] == (batch,) else t

    return {k: one(v) for k, v in input_dict.items()}, cut_rows(labels)


def take_tokens(input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
                tokens: int | None) -> Batch:
    """The first ``tokens`` label positions of the micro-batch (whole rows while they fit,
    else the first ``tokens`` of row 0); the whole micro-batch for None."""
    if tokens is None or tokens >= labels.numel():
        return input_dict, labels
    batch, seq = labels.shape[0], labels.shape[-1]
    rows = tokens // seq
    if rows >= 1:
        return cut_batch(input_dict, labels, lambda t: t[:rows])
    return cut_batch(input_dict, labels,
                     lambda t: t[:1, :tokens] if t.dim() >= 2 and t.shape[:2] == (batch, seq)
                     else t)


def row_bounds(rows: int, chunks: int) -> list[tuple[int, int]]:
    """``rows`` as ``chunks`` runs of whole rows, as even as possible, in order."""
    chunks = max(1, min(chunks, rows))
    edges = [round(i * rows / chunks) for i in range(chunks + 1)]
    return list(zip(edges, edges[1:], strict=False))


# ---------------------------------------------------------------- the trainer's state


@contextlib.contextmanager
def preserved_rng(device: torch.device) -> Iterator[None]:
    """Every RNG stream (CPU, and the device's) as it was on entry, on exit."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)


@contextlib.contextmanager
def taken_grads(params: list[nn.Parameter]) -> Iterator[list[torch.Tensor | None]]:
    """Yield every ``.grad`` (the tensors themselves) and leave None in their place; the same
    tensors are put back on exit."""
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield saved
    finally:
        for p, g in zip(params, saved, strict=True):
            p.grad = None
            p.grad = g


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _all_reduce_max(value: int, device: torch.device) -> int:
    if _world() == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def _all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    if _world() == 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def free_bytes(device: torch.device) -> int | None:
    """Memory a pass may still allocate on ``device`` (None where torch cannot say)."""
    if device.type != "cuda":
        return None
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(torch.cuda.mem_get_info(device)[0]) + max(0, int(cached))


OUT_OF_MEMORY: type[BaseException] = getattr(torch, "OutOfMemoryError",
                                             torch.cuda.OutOfMemoryError)


def out_of_memory(exc: BaseException) -> bool:
    """An allocation failure, also where a wrapper (a compiler, a checkpoint) re-raised it."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, OUT_OF_MEMORY):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type where it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def refuse_unsupported(parallel_dims: Any) -> None:
    """Raise :class:`AuditError` for a layout the audit does not cover.

    Pipeline parallelism: each stage holds other blocks and its schedule splits the batch.
    Context parallelism: each rank holds a slice of every sequence and attention runs over
    the ring only inside the trainer's context, which a block's replay does not enter.
    """
    if getattr(parallel_dims, "pp_enabled", False):
        raise AuditError("pipeline parallelism is not audited (each stage holds other "
                         "blocks and its schedule splits the batch): audit the job with "
                         "--parallelism.pipeline_parallel_degree 1 on fewer layers or more "
                         "memory per GPU")
    if getattr(parallel_dims, "cp_enabled", False):
        raise AuditError("context parallelism is not audited (a block's replay runs outside "
                         "the ring attention context): audit the job with "
                         "--parallelism.context_parallel_degree 1 and a shorter "
                         "--training.seq_len")


# ---------------------------------------------------------------- the audit


@dataclass
class _Plan:
    chunks: int
    estimate: int | None = None
    free: int | None = None
    outside: int = 1
    """Runs of rows of the reference of the parts outside the blocks (their logits, over a
    vocabulary of 100k and more, outweigh a block)."""
    eager: int = 1
    """Runs of rows of the blocks' eager replays: the whole batch, as the job ran it, unless
    it ran out of memory."""
    outside_eager: int = 1
    """Runs of rows of the eager replay of the parts outside the blocks (held to a block's
    replay, as the reference's)."""


class Audit:
    """One audit of one micro-batch: :meth:`recording` around the job's own forward and
    backward, then :meth:`finish` (see the module docstring)."""

    def __init__(self, model_parts: list[nn.Module], device: torch.device, kit: StepKit,
                 settings: AuditSettings, facts: JobFacts | None = None,
                 reference: str = "auto", chunks: int | None = None) -> None:
        self.model_parts = list(model_parts)
        self.part: Part | None = None
        self.block_keys: list[str] = []
        """Every block's ``model.layers`` key, in forward order (after :meth:`prepare`)."""
        self.block_modules: list[nn.Module] = []
        self.device = torch.device(device)
        self.kit = kit
        self.settings = settings
        self.facts = facts or JobFacts()
        self.reference_choice = reference
        self.chunks = chunks
        self.recorder: Recorder | None = None
        self.notes: list[str] = []
        self.times: dict[str, float] = {}
        self.peaks: dict[str, int] = {}
        """The device's peak allocation at the end of each phase (where the peak grew)."""

    def prepare(self) -> None:
        """Mark the blocks and make the recorder (before the job pass).

        Raises:
            AuditError: the model has no ``model.layers``.
        """
        try:
            self.recorder, found = recorder_for(self.model_parts)
        except RecordError as exc:
            raise AuditError(str(exc)) from None
        self.block_keys = [key for key, _ in found]
        self.block_modules = [module for _, module in found]

    def select(self, part: Part) -> None:
        """Replay only ``part`` (before the job pass, after :meth:`prepare`): the job pass
        records its blocks alone, or every block where it compares the parts outside them
        (their replay stands every block in as what the job computed). The one part of an
        audit in one step is the whole audit, reported as the command line reports one."""
        assert self.recorder is not None, "prepare() first"
        self.part = part if part.count > 1 else None
        self.recorder.keys = None if part.outside else set(part.blocks)

    @contextlib.contextmanager
    def recording(self) -> Iterator[Recorder]:
        """Record the block boundaries of the forward and backward run inside (after
        :meth:`prepare`, which this calls if it was not)."""
        if self.recorder is None:
            self.prepare()
        recorder = self.recorder
        assert recorder is not None
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        with blocks.intercepting(recorder):
            yield recorder
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times["job"] = time.perf_counter() - t0
        self._peak("job")

    def _peak(self, phase: str) -> None:
        """Keep the device's peak allocation so far as ``phase``'s."""
        if self.device.type == "cuda":
            self.peaks[phase] = torch.cuda.max_memory_allocated(self.device)

    # -- the whole audit ---------------------------------------------------------------

    def finish(self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
               job_loss: torch.Tensor) -> AuditResult:
        """Replay and compare, after the recorded job pass left the job's gradients in every
        ``.grad``; everything is given back as it was (collective: every rank calls it).

        Raises:
            AuditError: the job pass was not recorded, the replays do not fit, or this
                torch's FSDP is not one the audit reads (a sentence).
        """
        try:
            return self._finish(input_dict, labels, job_loss)
        except fsdp.FSDPLayoutError as exc:
            raise AuditError(str(exc)) from None

    def _finish(self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
                job_loss: torch.Tensor) -> AuditResult:
        records = self.recorder.records if self.recorder is not None else {}
        if not records:
            raise AuditError("no block of model.layers ran in the job pass (is the model "
                             "compiled as a whole? the audit needs each block's own call)")
        started = time.perf_counter()
        named = [(clean_name(n), p) for part in self.model_parts
                 for n, p in part.named_parameters()]
        params = [p for _, p in named]
        rows = int(labels.shape[0]) if labels.dim() else 1
        if self.chunks is not None:
            try:
                Bounds(int, 1, rows, unit="the micro-batch's rows").check(
                    self.chunks, "--reference-chunks")
            except ValueError as exc:
                raise AuditError(str(exc)) from None
        compute = self._compute_dtype(records)
        reference, note = precision.choose_reference(
            self.reference_choice, compute, fsdp.is_fsdp(self.model_parts), self.device)
        if note:
            self.notes.append(note)
        buffers = [(b, b.detach().clone()) for part in self.model_parts for b in part.buffers()]
        acc = Accumulator(self.settings, self.device)
        held = [HeldPrecision()]
        losses: dict[str, float] = {}
        part = self.part
        outside = part is None or part.outside
        replayed = [r for r in records.values() if part is None or r.key in part.blocks]
        segs = [s for s in segments(self.model_parts, self.facts)
                if part is None or s.name in part.blocks or (outside and s.kind != "block")]
        plan = self._plan(records, rows, reference, params)
        rtol = RTOL.get(compute, RTOL[torch.float32])
        with taken_grads(params) as job_grads, preserved_rng(self.device), \
                self._restoring(buffers) as restore:
            job = {name: g for (name, _), g in zip(named, job_grads, strict=True)}
            t0 = time.perf_counter()
            for record in replayed:
                self._block(record, job, acc, reference, held, plan, rtol, restore)
            self.times["blocks"] = time.perf_counter() - t0
            self._peak("blocks")
            head, losses = (0.0, 0.0), {"eager": 0.0, "reference": 0.0}
            if outside:
                t0 = time.perf_counter()
                head = self._outside(records, job, acc, reference, held, plan, rtol, restore,
                                     input_dict, labels, named, segs)
                self.times["outside"] = time.perf_counter() - t0
                self._peak("outside")
                t0 = time.perf_counter()
                losses = self._end_to_end(records, reference, held, plan, restore,
                                          input_dict, labels)
                self.times["end_to_end"] = time.perf_counter() - t0
                self._peak("end_to_end")
        for model_part in self.model_parts:
            fsdp.reshard([model_part])
        t0 = time.perf_counter()
        job_value = float(job_loss.detach().double().sum())
        job_value, head_eager, head_ref, eager_value, ref_value = _all_reduce_sum(
            [job_value, head[0], head[1], losses["eager"], losses["reference"]], self.device)
        tensors = acc.finish()
        # A model that casts down on its own (MoE experts in bfloat16 under float32
        # parameters) computes its loss at that width: its scalars get that dtype's tolerance.
        casts = getattr(held[0], "casts", {})
        scalar = torch.bfloat16 if casts.get("bfloat16") else (
            torch.float16 if casts.get("float16") else compute)
        loss = None
        if outside:
            tensors.append(loss_stats(job_value, head_eager, head_ref, scalar, self.settings,
                                      name="head loss (teacher-forced)", segment=HEAD))
            loss = loss_stats(job_value, eager_value, ref_value, scalar, self.settings)
        self.times["statistics"] = time.perf_counter() - t0
        self.times["total"] = time.perf_counter() - started + self.times.get("job", 0.0)
        notes = [*self.facts.notes, *self.notes, *held[0].notes(reference.dtype)]
        if plan.chunks > 1 or plan.outside > 1:
            notes.append(f"to fit in memory, the blocks' reference replays ran in "
                         f"{plan.chunks} run(s) of rows and the rest's in {plan.outside}")
        if plan.eager > 1 or plan.outside_eager > 1:
            notes.append(f"to fit in memory, the eager replays ran in {plan.eager} run(s) of "
                         f"rows (the rest's in {plan.outside_eager}): their parameters' "
                         "gradients are sums of runs, which round less than the job's one "
                         "sum, so those gradients are judged a little more strictly")
        tokens = int(_all_reduce_sum([float(labels.numel())], self.device)[0])
        peak = (torch.cuda.max_memory_allocated(self.device)
                if self.device.type == "cuda" else None)
        what = f"{len(replayed)} blocks" if part is None else (
            f"part {part.index} of {part.count}: " + (
                f"{len(replayed)} block(s)" if part.blocks else "the parts outside the blocks"))
        log.info("numerics audit: %s, %d tokens, reference %s, %.1f s", what, tokens,
                 reference.name, self.times["total"])
        return AuditResult(
            world_size=_world(), tokens=tokens, job_dtype=str(compute).removeprefix("torch."),
            reference=reference.name, settings=self.settings, segments=segs, tensors=tensors,
            loss=loss, loss_values={"job": job_value, "eager": eager_value,
                                    "reference": ref_value} if outside else {},
            time_s=self.times, peak_memory_bytes=peak,
            memory={"estimate_bytes": plan.estimate, "free_bytes": plan.free,
                    "records_bytes": self.recorder.held_bytes() if self.recorder else 0,
                    "peak_after_bytes": dict(self.peaks)},
            notes=notes, chunks=plan.chunks, outside_chunks=plan.outside,
            applied=list(self.facts.applied), part=part)

    # -- pieces ------------------------------------------------------------------------

    def _compute_dtype(self, records: dict[str, BlockRecord]) -> torch.dtype:
        """The dtype the job computes in: its autocast, else FSDP's parameter dtype, else
        the blocks' hidden state's."""
        first = next(iter(records.values()))
        enabled, dtype = first.autocast
        if enabled and dtype is not None:
            return dtype
        sharded = fsdp.compute_dtype(self.model_parts)
        if sharded is not None:
            return sharded
        hidden = first.hidden()
        if hidden is not None and hidden.is_floating_point():
            return hidden.dtype
        return torch.float32

    @contextlib.contextmanager
    def _restoring(self, buffers: list[tuple[torch.Tensor, torch.Tensor]]
                   ) -> Iterator[Callable[[], None]]:
        """Yield a function that puts every buffer's value back (MoE token counts grow in
        every forward); called again on exit."""

        def restore() -> None:
            with torch.no_grad():
                for b, value in buffers:
                    b.copy_(value)

        try:
            yield restore
        finally:
            restore()

    def _plan(self, records: dict[str, BlockRecord], rows: int, reference: precision.Reference,
              params: list[nn.Parameter]) -> _Plan:
        """Into how many runs of rows the replays split the micro-batch: given, or estimated
        before anything is allocated from the first block's saved activations (logged)."""
        if self.chunks is not None:
            return _Plan(self.chunks, outside=self.chunks)
        free = free_bytes(self.device)
        first = next(iter(records.values()))
        if free is None or first.saved_bytes is None:
            return _Plan(_all_reduce_max(1, self.device))
        estimate = self._estimate(first, reference, rows)
        fixed = self._fixed(first, reference)
        usable = int(0.9 * free) - fixed
        chunks = 1 if estimate <= usable else (
            rows + 1 if usable <= 0 else math.ceil(estimate / usable))
        chunks = _all_reduce_max(chunks, self.device)
        if chunks > rows:
            need = fixed + estimate / rows
            raise AuditError(
                f"the replays would need about {need / 2**30:.1f} GiB on {self.device} for "
                f"one row of one block, and {free / 2**30:.1f} GiB are free: audit fewer "
                "tokens (--tokens N) or on more GPUs")
        # The head's replays are held to a block's: the audit's peak is one block's replay
        # over what the step holds, wherever the vocabulary is.
        budget = max(estimate + fixed, 2**30)
        head = self._head_bytes(params, rows, reference)
        outside = _all_reduce_max(max(chunks, _runs(head, budget, rows)), self.device)
        # The blocks' eager replays run the whole micro-batch, as the job did, wherever it
        # fits: a parameter's gradient summed over runs of rows rounds less than the job's
        # one sum.
        eager_block = int(EAGER_FACTOR * (first.saved_bytes or 0))
        eager_head = self._head_bytes(params, rows, None)
        eager = _all_reduce_max(_runs(eager_block, usable, rows), self.device)
        outside_eager = _all_reduce_max(_runs(eager_head, budget, rows), self.device)
        log.info("numerics audit: a block's replays are estimated at %.1f GiB (eager %.1f), "
                 "the head's at %.1f GiB (eager %.1f; %.1f GiB free): the blocks in %d run(s) "
                 "of rows (eager %d), the rest in %d (eager %d)",
                 (estimate + fixed) / 2**30, (eager_block + fixed) / 2**30, head / 2**30,
                 eager_head / 2**30, free / 2**30, chunks, eager, outside, outside_eager)
        return _Plan(chunks, estimate + fixed, free, outside, eager, outside_eager)

    def _head_bytes(self, params: list[nn.Parameter], rows: int,
                    reference: precision.Reference | None) -> int:
        """The head's replay: its logits over the vocabulary (the widest two-dimensional
        parameter outside the blocks: the output projection or the embedding), at least
        float32 (the loss casts them), about four times over (logits, their log-softmax,
        and both gradients); the eager replay's where ``reference`` is None."""
        inside = {id(p) for m in self.block_modules for p in m.parameters()}
        vocab = max((int(p.shape[0]) for p in params if id(p) not in inside
                     and p.dim() == 2), default=0)
        first = next(iter(self.recorder.records.values())) if self.recorder else None
        hidden = first.hidden() if first is not None else None
        seq = int(hidden.shape[1]) if hidden is not None and hidden.dim() >= 2 else 1
        width = 4 if reference is None else max(4, reference.dtype.itemsize)
        return 4 * rows * seq * vocab * width

    def _estimate(self, record: BlockRecord, reference: precision.Reference, rows: int) -> int:
        width = max(1, self._compute_dtype({record.key: record}).itemsize)
        saved = record.saved_bytes or 0
        return int(EAGER_FACTOR * saved * max(1.0, reference.dtype.itemsize / width))

    def _fixed(self, record: BlockRecord, reference: precision.Reference) -> int:
        """What a block's replays hold whatever the rows: its parameters and gradients at the
        reference's width, the eager replay's outputs and input gradients, and the
        statistics' workspace."""
        numel = sum(p.numel() for p in record.module.parameters())
        out = sum(t.numel() * t.element_size() for t in record.outputs
                  if isinstance(t, torch.Tensor))
        return 3 * numel * reference.dtype.itemsize + 2 * out + WORKSPACE_BYTES

    def _bounds(self, record: BlockRecord, runs: int) -> list[tuple[int, int]]:
        rows = rows_of(record)
        if runs > 1 and not sliceable(record):
            raise AuditError(f"block {record.key}'s inputs cannot be cut into runs of rows "
                             f"(varlen metadata indexes the whole batch), and {runs} runs "
                             "were asked for or needed to fit: audit fewer tokens "
                             "(--tokens N) or on more GPUs")
        return row_bounds(rows, runs)

    def _retrying(self, plan: _Plan, rows: int, what: str, run: Callable[[], Any],
                  field: str = "chunks") -> Any:
        """``run``; in one process, again in twice as many runs of rows after running out of
        memory (down to one row per run; ``field`` is the plan's count it doubles). Ranks
        cannot retry alone: they fail."""
        while True:
            try:
                return run()
            except Exception as exc:
                if not out_of_memory(exc):
                    raise
                first = first_line(exc)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            runs = getattr(plan, field)
            given = self.chunks is not None and field in ("chunks", "outside")
            if _world() > 1 or given or runs >= rows:
                raise AuditError(f"the {what} replay ran out of memory on {self.device} in "
                                 f"{runs} run(s) of rows ({_allocation(first)}): audit "
                                 "fewer tokens (--tokens N) or on more GPUs") from None
            setattr(plan, field, min(rows, runs * 2))
            log.info("numerics audit: the %s replay did not fit (%s); again in %d runs of "
                     "rows", what, _allocation(first), getattr(plan, field))

    def _block(self, record: BlockRecord, job: dict[str, torch.Tensor | None],
               acc: Accumulator, reference: precision.Reference, held: list[HeldPrecision],
               plan: _Plan, rtol: float, restore: Callable[[], None]) -> None:
        """One block: its eager replay over the whole micro-batch, as the job ran it (a
        parameter's gradient summed over runs of rows would round less than the job's one
        sum, and eager would look better than it is), then its reference replay in the
        plan's runs of rows, each compared with the same rows of the job's and eager's."""
        module = record.module
        at = f"layers.{record.key}"
        names = [(f"{at}.{clean_name(n)}", p) for n, p in module.named_parameters()]
        rows = rows_of(record)
        eager: dict[str, Any] = {}

        def eager_pass() -> None:
            restore()
            t0 = time.perf_counter()
            with precision.eager(), precision.autocast_as(self.device, record.autocast):
                runs = [replay_block(record, lo, hi, None)
                        for lo, hi in self._bounds(record, plan.eager)]
            self._tick("blocks_eager", t0)
            eager["run"] = _joined(runs)
            eager["grads"] = {n: p.grad for n, p in names}
            for _, p in names:
                p.grad = None

        def reference_pass() -> None:
            scratch = Accumulator(self.settings, self.device)  # merged once the block ran
            restore()
            t0 = time.perf_counter()
            with precision.retyped([module], reference.dtype), precision.eager():
                for lo, hi in self._bounds(record, plan.chunks):
                    with precision.reference_arithmetic(reference, held[0], self.device,
                                                        [module]):
                        ref_run = replay_block(record, lo, hi, reference.dtype)
                    self._compare_run(record, lo, hi, eager["run"], ref_run, scratch, rtol,
                                      at)
                ref_grads = {n: p.grad for n, p in names}
            self._tick("blocks_reference", t0)
            for n, p in names:
                p.grad = None
                scratch.add(n, record.key, "param_grad", job.get(n), eager["grads"][n],
                            ref_grads.get(n), rtol)
            fsdp.reshard([module])
            acc.absorb(scratch)

        def both() -> None:
            self._retrying(plan, rows, f"block {record.key} eager", eager_pass, "eager")
            self._retrying(plan, rows, f"block {record.key} reference", reference_pass)

        self._held_or_not(held, both)
        restore()

    def _held_or_not(self, held: list[Any], run: Callable[[], Any]) -> Any:
        """``run``; where a kernel refuses the held dtype (an extension taking bfloat16 only),
        ``run`` again with the model's down-casts as it writes them, said once in a note and
        the log (its low-precision parts are then judged against themselves)."""
        try:
            return run()
        except Exception as exc:
            if isinstance(exc, AuditError) or out_of_memory(exc) or \
                    not isinstance(held[0], HeldPrecision):
                raise
            note = (f"reference: the model's own down-casts could not be held "
                    f"({type(exc).__name__}: {first_line(exc)}); it runs them as the model "
                    "writes them, so its low-precision parts are judged against themselves")
            log.warning("numerics audit: %s", note)
            self.notes.append(note)
            held[0] = _Unheld()
            for part in self.model_parts:
                for p in part.parameters():
                    p.grad = None
            return run()

    def _tick(self, what: str, since: float) -> None:
        """Add the seconds since ``since`` to ``time_s[what]`` (the device's work included)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times[what] = self.times.get(what, 0.0) + time.perf_counter() - since

    def _compare_run(self, record: BlockRecord, lo: int, hi: int, eager_run: Any,
                     ref_run: Any, acc: Accumulator, rtol: float, at: str) -> None:
        """Rows ``[lo, hi)`` of the block's outputs and input gradients: the job's, the
        eager replay's (over the whole batch) and the reference's (over these rows)."""
        lead = tuple(record.hidden().shape[:2]) if record.hidden() is not None else ()
        single_out = sum(isinstance(o, torch.Tensor) for o in record.outputs) == 1
        single_in = sum(record.needs_grad) == 1
        for i, job_out in enumerate(record.outputs):
            if isinstance(job_out, torch.Tensor) and job_out.is_floating_point():
                name = f"{at} output" + ("" if single_out else f"[{i}]")
                acc.add(name, record.key, "output", cut(job_out, lead, lo, hi),
                        cut(eager_run.outputs[i], lead, lo, hi), ref_run.outputs[i], rtol)
        for i, needs in enumerate(record.needs_grad):
            if needs:
                name = f"{at} input grad" + ("" if single_in else f"[{i}]")
                job_grad = record.grad_inputs.get(i)
                eager_grad = eager_run.grad_inputs.get(i)
                acc.add(name, record.key, "input_grad",
                        None if job_grad is None else cut(job_grad, lead, lo, hi),
                        None if eager_grad is None else cut(eager_grad, lead, lo, hi),
                        ref_run.grad_inputs.get(i), rtol)

    def _outside(self, records: dict[str, BlockRecord], job: dict[str, torch.Tensor | None],
                 acc: Accumulator, reference: precision.Reference, held: list[HeldPrecision],
                 plan: _Plan, rtol: float, restore: Callable[[], None],
                 input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
                 named: list[tuple[str, nn.Parameter]], segs: list[Segment]
                 ) -> tuple[float, float]:
        """The parts outside the blocks, teacher-forced; returns the head's loss (eager,
        reference)."""
        inside = {id(p) for r in records.values() for p in r.module.parameters()}
        outside = [(n, p) for n, p in named if id(p) not in inside]
        first, last = next(iter(records.values())), list(records.values())[-1]
        lead = tuple(first.hidden().shape[:2]) if first.hidden() is not None else ()
        where = self._outside_segments(outside)
        blocks_ = [r.module for r in records.values()]
        rows = int(labels.shape[0])
        last_out = next((i for i, o in enumerate(last.outputs) if isinstance(o, torch.Tensor)
                         and i in last.grad_outputs), None)

        cuttable = all(sliceable(r) for r in records.values())
        eager: dict[str, Any] = {}

        def one_pass(dtype: torch.dtype | None, runs: int) -> tuple[float, list[StandIn],
                                                                    dict[str, Any]]:
            restore()
            total, stands = 0.0, []
            for lo, hi in row_bounds(rows, runs if cuttable else 1):
                stand = StandIn(records, lo, hi, dtype)
                batch = cut_batch(input_dict, labels, lambda t, lo=lo, hi=hi: t[lo:hi])
                with blocks.intercepting(stand):
                    loss = self.kit.run(*batch)
                total += float(loss.detach().double().sum())
                stands.append(stand)
            grads = {n: p.grad for n, p in outside}
            for _, p in outside:
                p.grad = None
            return total, stands, grads

        def joined(stands: list[StandIn], what: str) -> torch.Tensor | None:
            pieces = [s.first_input[0] if what == "first" else
                      s.last_grad[0][_tensor_index(last.outputs, last_out)]
                      for s in stands if (s.first_input if what == "first" else s.last_grad)]
            if len(pieces) != len(stands) or any(p is None for p in pieces):
                return None
            return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

        def eager_pass() -> None:
            # Whole, as the job ran it (see _block): the parameters' gradients round alike.
            with precision.eager():
                eager["loss"], stands, eager["grads"] = one_pass(None, plan.outside_eager)
            eager["first"] = joined(stands, "first")
            eager["last"] = joined(stands, "last") if last_out is not None else None

        def reference_pass() -> float:
            with precision.retyped(self.model_parts, reference.dtype, exclude=blocks_), \
                    precision.eager(), self.kit.reference(), \
                    precision.reference_arithmetic(reference, held[0], self.device,
                                                   self.model_parts):
                ref_loss, ref_stands, ref_grads = one_pass(reference.dtype, plan.outside)
            scratch = Accumulator(self.settings, self.device)
            hidden = first.hidden()
            for r in ref_stands:
                lo, hi = r.lo, r.hi
                if hidden is not None and eager["first"] is not None and r.first_input:
                    scratch.add("embedding output", EMBEDDING, "output",
                                cut(hidden, lead, lo, hi), cut(eager["first"], lead, lo, hi),
                                r.first_input[0], rtol)
                if last_out is not None and eager["last"] is not None and r.last_grad:
                    scratch.add("head input grad", HEAD, "input_grad",
                                cut(last.grad_outputs[last_out], lead, lo, hi),
                                cut(eager["last"], lead, lo, hi),
                                r.last_grad[0][_tensor_index(last.outputs, last_out)], rtol)
            for n, _ in outside:
                scratch.add(n, where.get(n, HEAD), "param_grad", job.get(n),
                            eager["grads"][n], ref_grads[n], rtol)
            acc.absorb(scratch)
            return ref_loss

        def both() -> tuple[float, float]:
            self._retrying(plan, rows, "outside-the-blocks eager", eager_pass, "outside_eager")
            ref_loss = self._retrying(plan, rows, "outside-the-blocks reference",
                                      reference_pass, "outside")
            return eager["loss"], ref_loss

        result = self._held_or_not(held, both)
        restore()
        return result

    def _outside_segments(self, outside: list[tuple[str, nn.Parameter]]) -> dict[str, str]:
        """Each outside parameter's segment: the embedding for the model's children declared
        before ``layers`` (TorchTitan declares them in call order), the head for the rest (a
        tied embedding and output weight is named once, by its first module)."""
        before: set[str] = set()
        for part in self.model_parts:
            for name, _ in part.named_children():
                if name == "layers":
                    break
                before.add(name)
        return {name: EMBEDDING if name.split(".", 1)[0] in before else HEAD
                for name, _ in outside}

    def _end_to_end(self, records: dict[str, BlockRecord], reference: precision.Reference,
                    held: list[HeldPrecision], plan: _Plan, restore: Callable[[], None],
                    input_dict: dict[str, torch.Tensor], labels: torch.Tensor
                    ) -> dict[str, float]:
        """Forward-only whole-model losses, eager and in the reference's arithmetic (each
        block re-typed only while it runs)."""
        rows = int(labels.shape[0])
        block_modules = [r.module for r in records.values()]

        def one_pass(dtype: torch.dtype | None) -> float:
            restore()
            total = 0.0
            for lo, hi in row_bounds(rows, plan.outside if all(
                    sliceable(r) for r in records.values()) else 1):
                batch = cut_batch(input_dict, labels, lambda t, lo=lo, hi=hi: t[lo:hi])
                with torch.no_grad():
                    total += float(self.kit.forward(*batch).detach().double().sum())
            return total

        def attempt() -> dict[str, float]:
            with precision.eager():
                eager = one_pass(None)
            per_block = _PerBlockRetype(block_modules, reference.dtype)
            with precision.retyped(self.model_parts, reference.dtype, exclude=block_modules), \
                    precision.eager(), self.kit.reference(), blocks.intercepting(per_block), \
                    precision.reference_arithmetic(reference, held[0], self.device,
                                                   self.model_parts):
                ref = one_pass(reference.dtype)
            return {"eager": eager, "reference": ref}

        result = self._held_or_not(held, lambda: self._retrying(
            plan, rows, "end-to-end", attempt, "outside"))
        restore()
        return result


class _Unheld:
    """The reference's arithmetic without held down-casts (after a kernel refused them)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

    def notes(self, dtype: torch.dtype) -> list[str]:
        """Nothing was held."""
        return []


def _runs(need: int, usable: int, rows: int) -> int:
    """Runs of rows for a replay needing ``need`` bytes over the whole micro-batch in
    ``usable`` bytes (at most one run per row)."""
    if need <= usable:
        return 1
    return rows if usable <= 0 else min(rows, math.ceil(need / usable))


def _joined(runs: list[Any]) -> Any:
    """Runs of rows of one block's replay as one (their outputs and input gradients joined
    along the rows)."""
    if len(runs) == 1:
        return runs[0]
    from titan_rocm.numerics.replay import BlockReplay

    outputs = [torch.cat([r.outputs[i] for r in runs]) if isinstance(o, torch.Tensor) else o
               for i, o in enumerate(runs[0].outputs)]
    grads = {i: torch.cat([r.grad_inputs[i] for r in runs]) for i in runs[0].grad_inputs
             if all(i in r.grad_inputs for r in runs)}
    return BlockReplay(outputs, grads)


@dataclass
class _PerBlockRetype:
    """A block-boundary interceptor: each block's parameters at ``dtype`` while it runs."""

    modules: list[nn.Module]
    dtype: torch.dtype

    def around(self, key: str, module: nn.Module, args: tuple[Any, ...],
               kwargs: dict[str, Any], proceed: blocks.Call) -> Any:
        with precision.retyped([module], self.dtype):
            return proceed(args, kwargs)


def _tensor_index(leaves: list[Any], index: int) -> int:
    """The position of leaf ``index`` among the tensor leaves."""
    return sum(isinstance(t, torch.Tensor) for t in leaves[:index])


def _allocation(first: str) -> str:
    # Not torch's own words: check-log reads "CUDA out of memory" as the job's crash.
    import re

    asked = re.search(r"Tried to allocate [\d.]+ \w+", first)
    return asked.group(0) if asked else "an allocation failed"


def audit_micro_batch(model_parts: list[nn.Module], device: torch.device,
                      kit_of: Callable[[torch.Tensor], StepKit],
                      input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
                      settings: AuditSettings, facts: JobFacts | None = None,
                      tokens: int | None = None, chunks: int | None = None,
                      reference: str = "auto") -> AuditResult:
    """``titan-rocm audit``'s audit of a built trainer: one micro-batch (its first
    ``tokens``), moved to ``device``; the step ``kit_of(labels)`` makes (its loss denominator
    from those labels) runs the job pass here, compiled, then :meth:`Audit.finish`. The
    trainer's gradients are as they were before, after.

    Raises:
        AuditError: the audit cannot run (one sentence).
    """
    input_dict, labels = take_tokens(input_dict, labels, tokens)
    input_dict = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                  for k, v in input_dict.items()}
    labels = labels.to(device)
    audit = Audit(model_parts, device, kit_of(labels), settings, facts, reference, chunks)
    audit.prepare()
    params = [p for part in model_parts for p in part.parameters()]
    buffers = [(b, b.detach().clone()) for part in model_parts for b in part.buffers()]
    # The job pass is the audit's own here: its buffer updates (MoE token counts) go too.
    with taken_grads(params), preserved_rng(device), audit._restoring(buffers):
        try:
            with audit.recording():
                loss = audit.kit.run(input_dict, labels)
        except Exception as exc:
            if out_of_memory(exc):
                raise AuditError(f"the job pass ran out of memory on {device} "
                                 f"({_allocation(first_line(exc))}): audit fewer tokens "
                                 "(--tokens N) or on more GPUs") from None
            raise
        return audit.finish(input_dict, labels, loss)
