"""The numerics audit of one micro-batch: block by block, teacher-forced (docs/numerics-audit.md).

Teacher forcing (each block replayed from the job's own inputs and output gradients) is why a
wrong kernel in block k shows in block k alone, and why an audit can be spread over steps."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.numbers import Bounds
from titan_rocm.numerics import blocks, fsdp, precision
from titan_rocm.numerics.attribution import HEAD, JobFacts, Segment, clean_name, segments
from titan_rocm.numerics.audit_run import AuditRun, Plan, Runs, StepKit
from titan_rocm.numerics.held_precision import HeldPrecision
from titan_rocm.numerics.record import BlockRecord, Recorder, RecordError, recorder_for
from titan_rocm.numerics.result import AuditError, AuditResult, Part
from titan_rocm.numerics.rows import Batch, runs_needed, take_tokens
from titan_rocm.numerics.state import (
    all_reduce_max,
    all_reduce_sum,
    allocation,
    first_line,
    free_bytes,
    out_of_memory,
    preserved_rng,
    restoring,
    taken_grads,
    world,
)
from titan_rocm.numerics.stats import (
    RTOL,
    WORKSPACE_BYTES,
    Accumulator,
    AuditSettings,
    TensorStats,
    loss_stats,
)
from titan_rocm.numerics.submodules import Inside

EAGER_FACTOR = 3.0
"""Eager keeps about this many times what the compiled block saved (unfused intermediates); only
the first block's estimate uses it, later ones what it measured."""


def refuse_unsupported(parallel_dims: Any) -> None:
    """Raise :class:`AuditError` for pipeline parallelism (a stage holds other blocks) and context
    parallelism (ring attention runs only inside the trainer's context, which a replay skips)."""
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


class Audit:
    """One audit of one micro-batch: :meth:`recording` around the job's forward and backward, then
    :meth:`finish`."""

    def __init__(self, model_parts: list[nn.Module], device: torch.device, kit: StepKit,
                 settings: AuditSettings, facts: JobFacts | None = None,
                 reference: str = "auto", chunks: int | None = None,
                 submodules: str = "auto") -> None:
        self.model_parts = list(model_parts)
        self.submodules = submodules
        self.part: Part | None = None
        self.block_keys: list[str] = []
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

    def prepare(self) -> None:
        """Mark the blocks and make the recorder, before the job pass (AuditError without
        ``model.layers``)."""
        try:
            self.recorder, found = recorder_for(self.model_parts)
        except RecordError as exc:
            raise AuditError(str(exc)) from None
        self.block_keys = [key for key, _ in found]
        self.block_modules = [module for _, module in found]

    def select(self, part: Part) -> None:
        """Replay only ``part``; the last part also compares the parts outside the blocks."""
        assert self.recorder is not None, "prepare() first"
        self.part = part if part.count > 1 else None
        self.recorder.keys = None if part.outside else set(part.blocks)

    @contextlib.contextmanager
    def recording(self) -> Iterator[Recorder]:
        """Record the block boundaries of the forward and backward run inside."""
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
        if self.device.type == "cuda":
            self.peaks[phase] = torch.cuda.max_memory_allocated(self.device)

    # -- the whole audit ---------------------------------------------------------------

    def finish(self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
               job_loss: torch.Tensor) -> AuditResult:
        """Replay and compare after the recorded job pass, giving everything back (collective).

        Raises AuditError (one sentence) when the job pass was not recorded, the replays do not
        fit, or this torch's FSDP is not one the audit reads."""
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
        run = self._start(records, (input_dict, labels))
        params = [p for _, p in run.named]
        with taken_grads(params) as job_grads, preserved_rng(self.device), \
                restoring(run.buffers):
            run.job = {name: g for (name, _), g in zip(run.named, job_grads, strict=True)}
            head, losses = self._replay(run)
        for model_part in self.model_parts:
            fsdp.reshard([model_part])
        return self._result(run, job_loss, head, losses, started)

    @property
    def _compares_outside(self) -> bool:
        return self.part is None or self.part.outside

    def _start(self, records: dict[str, BlockRecord], batch: Batch) -> AuditRun:
        named = [(clean_name(n), p) for part in self.model_parts
                 for n, p in part.named_parameters()]
        labels = batch[1]
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
        acc, held = Accumulator(self.settings, self.device), HeldPrecision()
        plan = self._plan(records, rows, reference, [p for _, p in named])
        return AuditRun(
            model_parts=self.model_parts, device=self.device, kit=self.kit,
            settings=self.settings, records=records, job={}, named=named, batch=batch,
            compute=compute, reference=reference, held=held, plan=plan,
            rtol=RTOL.get(compute, RTOL[torch.float32]), buffers=buffers, acc=acc,
            notes=self.notes, times=self.times,
            inside=None if self.submodules == "off" else Inside(self.submodules))

    def _replayed(self, run: AuditRun) -> list[BlockRecord]:
        return [r for r in run.records.values() if self.part is None or r.key in self.part.blocks]

    def _replay(self, run: AuditRun) -> tuple[tuple[float, float], dict[str, float]]:
        t0 = time.perf_counter()
        for record in self._replayed(run):
            run.block(record)
        self.times["blocks"] = time.perf_counter() - t0
        self._peak("blocks")
        if not self._compares_outside:
            return (0.0, 0.0), {"eager": 0.0, "reference": 0.0}
        t0 = time.perf_counter()
        head = run.outside()
        self.times["outside"] = time.perf_counter() - t0
        self._peak("outside")
        t0 = time.perf_counter()
        losses = run.end_to_end()
        self.times["end_to_end"] = time.perf_counter() - t0
        self._peak("end_to_end")
        return head, losses

    def _statistics(self, run: AuditRun, job_loss: torch.Tensor, head: tuple[float, float],
                    losses: dict[str, float]
                    ) -> tuple[list[TensorStats], TensorStats | None, dict[str, float]]:
        job_value = float(job_loss.detach().double().sum())
        job_value, head_eager, head_ref, eager_value, ref_value = all_reduce_sum(
            [job_value, head[0], head[1], losses["eager"], losses["reference"]], self.device)
        tensors = run.acc.finish()
        # A model that casts down on its own (MoE experts in bfloat16 under float32
        # parameters) computes its loss at that width: its scalars get that dtype's tolerance.
        casts = getattr(run.held, "casts", {})
        scalar = torch.bfloat16 if casts.get("bfloat16") else (
            torch.float16 if casts.get("float16") else run.compute)
        if not self._compares_outside:
            return tensors, None, {}
        tensors.append(loss_stats(job_value, head_eager, head_ref, scalar, self.settings,
                                  name="head loss (teacher-forced)", segment=HEAD))
        loss = loss_stats(job_value, eager_value, ref_value, scalar, self.settings)
        return tensors, loss, {"job": job_value, "eager": eager_value, "reference": ref_value}

    def _notes(self, run: AuditRun) -> list[str]:
        plan = run.plan
        notes = [*self.facts.notes, *self.notes, *run.held.notes(run.reference.dtype),
                 *(run.inside.notes() if run.inside is not None else [])]
        if plan.chunks.count > 1 or plan.outside.count > 1:
            notes.append(f"to fit in memory, the blocks' reference replays ran in "
                         f"{plan.chunks.count} run(s) of rows and the rest's in "
                         f"{plan.outside.count}")
        if plan.eager.count > 1 or plan.outside_eager.count > 1:
            notes.append(f"to fit in memory, the eager replays ran in {plan.eager.count} "
                         f"run(s) of rows (the rest's in {plan.outside_eager.count}): their "
                         "parameters' gradients are sums of runs, which round less than the "
                         "job's one sum, so those gradients are judged a little more strictly")
        return notes

    def _result(self, run: AuditRun, job_loss: torch.Tensor, head: tuple[float, float],
                losses: dict[str, float], started: float) -> AuditResult:
        t0 = time.perf_counter()
        tensors, loss, loss_values = self._statistics(run, job_loss, head, losses)
        self.times["statistics"] = time.perf_counter() - t0
        self.times["total"] = time.perf_counter() - started + self.times.get("job", 0.0)
        notes = self._notes(run)
        tokens = int(all_reduce_sum([float(run.batch[1].numel())], self.device)[0])
        peak = (torch.cuda.max_memory_allocated(self.device)
                if self.device.type == "cuda" else None)
        self._log_done(len(self._replayed(run)), tokens, run.reference.name)
        plan = run.plan
        return AuditResult(
            world_size=world(), tokens=tokens, job_dtype=str(run.compute).removeprefix("torch."),
            reference=run.reference.name, settings=self.settings, segments=self._segments(),
            tensors=tensors, loss=loss, loss_values=loss_values, time_s=self.times,
            peak_memory_bytes=peak,
            memory={"estimate_bytes": plan.estimate, "free_bytes": plan.free,
                    "records_bytes": self.recorder.held_bytes() if self.recorder else 0,
                    "peak_after_bytes": dict(self.peaks)},
            notes=notes, chunks=plan.chunks.count, outside_chunks=plan.outside.count,
            applied=list(self.facts.applied), part=self.part)

    def _segments(self) -> list[Segment]:
        part, outside = self.part, self._compares_outside
        return [s for s in segments(self.model_parts, self.facts)
                if part is None or s.name in part.blocks or (outside and s.kind != "block")]

    def _log_done(self, replayed: int, tokens: int, reference: str) -> None:
        part = self.part
        what = f"{replayed} blocks" if part is None else (
            f"part {part.index} of {part.count}: " + (
                f"{replayed} block(s)" if part.blocks else "the parts outside the blocks"))
        log.info("numerics audit: %s, %d tokens, reference %s, %.1f s", what, tokens,
                 reference, self.times["total"])

    # -- the plan ----------------------------------------------------------------------

    def _compute_dtype(self, records: dict[str, BlockRecord]) -> torch.dtype:
        """Its autocast, else FSDP's parameter dtype, else the blocks' hidden state's."""
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


    def _plan(self, records: dict[str, BlockRecord], rows: int, reference: precision.Reference,
              params: list[nn.Parameter]) -> Plan:
        """Given, or estimated from the first block's saved activations before anything is
        allocated."""
        if self.chunks is not None:
            return Plan(Runs(self.chunks, given=True), Runs(self.chunks, given=True))
        free = free_bytes(self.device)
        first = next(iter(records.values()))
        if free is None or first.saved_bytes is None:
            return Plan(Runs(all_reduce_max(1, self.device)), Runs(1))
        estimate = self._estimate(first, reference, rows)
        fixed = self._fixed(first, reference)
        usable = int(0.9 * free) - fixed
        chunks = 1 if estimate <= usable else (
            rows + 1 if usable <= 0 else math.ceil(estimate / usable))
        chunks = all_reduce_max(chunks, self.device)
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
        outside = all_reduce_max(max(chunks, runs_needed(head, budget, rows)), self.device)
        # The blocks' eager replays run the whole micro-batch, as the job did, wherever it
        # fits: a parameter's gradient summed over runs of rows rounds less than the job's
        # one sum.
        eager_block = int(EAGER_FACTOR * (first.saved_bytes or 0))
        eager_head = self._head_bytes(params, rows, None)
        eager = all_reduce_max(runs_needed(eager_block, usable, rows), self.device)
        outside_eager = all_reduce_max(runs_needed(eager_head, budget, rows), self.device)
        log.info("numerics audit: a block's replays are estimated at %.1f GiB (eager %.1f), "
                 "the head's at %.1f GiB (eager %.1f; %.1f GiB free): the blocks in %d run(s) "
                 "of rows (eager %d), the rest in %d (eager %d)",
                 (estimate + fixed) / 2**30, (eager_block + fixed) / 2**30, head / 2**30,
                 eager_head / 2**30, free / 2**30, chunks, eager, outside, outside_eager)
        return Plan(Runs(chunks), Runs(outside), Runs(eager), Runs(outside_eager),
                    estimate + fixed, free)

    def _head_bytes(self, params: list[nn.Parameter], rows: int,
                    reference: precision.Reference | None) -> int:
        """About four copies of the logits (logits, log-softmax, both gradients) at least
        float32; the widest 2-D parameter outside the blocks gives the vocabulary."""
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
        """What a block's replays hold whatever the rows."""
        numel = sum(p.numel() for p in record.module.parameters())
        out = sum(t.numel() * t.element_size() for t in record.outputs
                  if isinstance(t, torch.Tensor))
        return 3 * numel * reference.dtype.itemsize + 2 * out + WORKSPACE_BYTES


def audit_micro_batch(model_parts: list[nn.Module], device: torch.device,
                      kit_of: Callable[[torch.Tensor], StepKit],
                      input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
                      settings: AuditSettings, facts: JobFacts | None = None,
                      tokens: int | None = None, chunks: int | None = None,
                      reference: str = "auto", submodules: str = "auto") -> AuditResult:
    """``titan-rocm audit``'s audit of a built trainer's first micro-batch; the trainer's gradients
    are as they were, after (AuditError when it cannot run)."""
    input_dict, labels = take_tokens(input_dict, labels, tokens)
    input_dict = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                  for k, v in input_dict.items()}
    labels = labels.to(device)
    audit = Audit(model_parts, device, kit_of(labels), settings, facts, reference, chunks,
                  submodules)
    audit.prepare()
    params = [p for part in model_parts for p in part.parameters()]
    buffers = [(b, b.detach().clone()) for part in model_parts for b in part.buffers()]
    # The job pass is the audit's own here: its buffer updates (MoE token counts) go too.
    with taken_grads(params), preserved_rng(device), restoring(buffers):
        try:
            with audit.recording():
                loss = audit.kit.run(input_dict, labels)
        except Exception as exc:
            if out_of_memory(exc):
                raise AuditError(f"the job pass ran out of memory on {device} "
                                 f"({allocation(first_line(exc))}): audit fewer tokens "
                                 "(--tokens N) or on more GPUs") from None
            raise
        return audit.finish(input_dict, labels, loss)
