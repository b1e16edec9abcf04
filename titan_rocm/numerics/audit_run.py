"""The replays of one audit, after its job pass (docs/numerics-audit.md)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch
import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.numerics import blocks, fsdp, precision, submodules
from titan_rocm.numerics.attribution import EMBEDDING, HEAD, clean_name
from titan_rocm.numerics.held_precision import HeldPrecision
from titan_rocm.numerics.record import BlockRecord
from titan_rocm.numerics.replay import BlockReplay, StandIn, cut, replay_block, rows_of, sliceable
from titan_rocm.numerics.result import AuditError
from titan_rocm.numerics.rows import Batch, cut_batch, joined, row_bounds
from titan_rocm.numerics.state import allocation, first_line, out_of_memory, put_back, world
from titan_rocm.numerics.stats import Accumulator, AuditSettings

T = TypeVar("T")


class StepKit(Protocol):
    """A TorchTitan generation's step on one micro-batch, its loss denominator fixed."""

    def run(self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        """Forward and backward as the trainer runs them; returns the loss."""

    def forward(self, input_dict: dict[str, torch.Tensor],
                labels: torch.Tensor) -> torch.Tensor:
        """The same loss, forward only (called under ``torch.no_grad``)."""

    def reference(self) -> contextlib.AbstractContextManager[Any]:
        """The trainer's own switches for the reference's arithmetic (its autocast off)."""


@dataclass
class Runs:
    """Runs of rows one kind of replay splits the micro-batch into: doubled after running out of
    memory in one process, unless the user gave ``--reference-chunks``."""

    count: int
    given: bool = False


@dataclass
class Plan:
    """The runs of rows of each kind of replay, and the estimate they came from."""

    chunks: Runs
    outside: Runs
    """The outside reference and the end-to-end passes (their logits, over a 100k vocabulary,
    outweigh a block)."""
    eager: Runs = field(default_factory=lambda: Runs(1))
    """The whole batch, as the job ran it, unless it ran out of memory."""
    outside_eager: Runs = field(default_factory=lambda: Runs(1))
    estimate: int | None = None
    free: int | None = None


class Unheld:
    """The reference's arithmetic without held down-casts (after a kernel refused them)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

    def notes(self, dtype: torch.dtype) -> list[str]:
        """Nothing was held."""
        return []


@dataclass
class _EagerBlock:
    replay: BlockReplay
    grads: dict[str, torch.Tensor | None]


@dataclass
class _Outside:
    params: list[tuple[str, nn.Parameter]]
    where: dict[str, str]
    first: BlockRecord
    last: BlockRecord
    last_out: int | None
    """The last block's output the head's gradient arrived at (None: none did)."""
    lead: tuple[int, ...]
    cuttable: bool


@dataclass
class _OutsidePass:
    loss: float
    stands: list[StandIn]
    grads: dict[str, torch.Tensor | None]
    first: torch.Tensor | None = None
    last: torch.Tensor | None = None


@dataclass
class AuditRun:
    """The replays of one audit and what they share; every rank makes the same calls in the same
    order."""

    model_parts: list[nn.Module]
    device: torch.device
    kit: StepKit
    settings: AuditSettings
    records: dict[str, BlockRecord]
    job: dict[str, torch.Tensor | None]
    named: list[tuple[str, nn.Parameter]]
    batch: Batch
    compute: torch.dtype
    reference: precision.Reference
    held: HeldPrecision | Unheld
    plan: Plan
    rtol: float
    buffers: list[tuple[torch.Tensor, torch.Tensor]]
    acc: Accumulator
    notes: list[str]
    """The audit's notes (shared with it): a fallback adds one."""
    times: dict[str, float]
    inside: submodules.Inside | None = None
    """The blocks' children compared on their own (None: ``numerics_audit_submodules`` off)."""

    @property
    def rows(self) -> int:
        return int(self.batch[1].shape[0])

    def restore(self) -> None:
        """Every buffer's value back before a pass (MoE token counts grow in every forward)."""
        put_back(self.buffers)

    def tick(self, what: str, since: float) -> None:
        """Add the seconds since ``since`` to ``time_s[what]`` (the device's work included)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times[what] = self.times.get(what, 0.0) + time.perf_counter() - since

    # -- fallbacks -------------------------------------------------------------------------

    def held_or_not(self, run: Callable[[], T]) -> T:
        """``run``; where a kernel refuses the held dtype (a bfloat16-only extension), again with
        the model's own down-casts, said once (those parts are then judged against
        themselves)."""
        try:
            return run()
        except Exception as exc:
            if isinstance(exc, AuditError) or out_of_memory(exc) or \
                    isinstance(self.held, Unheld):
                raise
            note = (f"reference: the model's own down-casts could not be held "
                    f"({type(exc).__name__}: {first_line(exc)}); it runs them as the model "
                    "writes them, so its low-precision parts are judged against themselves")
            log.warning("numerics audit: %s", note)
            self.notes.append(note)
            self.held = Unheld()
            for part in self.model_parts:
                for p in part.parameters():
                    p.grad = None
            return run()

    def retrying(self, runs: Runs, rows: int, what: str, run: Callable[[], T]) -> T:
        """``run``, again in twice as many runs of rows after running out of memory (one process
        only: ranks cannot retry alone)."""
        while True:
            try:
                return run()
            except Exception as exc:
                if not out_of_memory(exc):
                    raise
                first = first_line(exc)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if world() > 1 or runs.given or runs.count >= rows:
                raise AuditError(f"the {what} replay ran out of memory on {self.device} in "
                                 f"{runs.count} run(s) of rows ({allocation(first)}): audit "
                                 "fewer tokens (--tokens N) or on more GPUs") from None
            runs.count = min(rows, runs.count * 2)
            log.info("numerics audit: the %s replay did not fit (%s); again in %d runs of "
                     "rows", what, allocation(first), runs.count)

    # -- a block ---------------------------------------------------------------------------

    def block(self, record: BlockRecord) -> None:
        """One block: eager over the whole micro-batch, as the job ran it (gradients summed over
        runs would round less than the job's one sum, flattering eager), then the reference
        per run."""
        rows = rows_of(record)

        def both() -> None:
            eager = self.retrying(self.plan.eager, rows, f"block {record.key} eager",
                                  lambda: self._block_eager(record))
            self.retrying(self.plan.chunks, rows, f"block {record.key} reference",
                          lambda: self._block_reference(record, eager))

        self.held_or_not(both)
        self.restore()
        if self.inside is not None:
            self._children(record)
            self.restore()

    def _children(self, record: BlockRecord) -> None:
        """Each child of the block alone (:mod:`titan_rocm.numerics.submodules`), from what the
        probed compiled copy computed at its boundaries: eager, and in the reference's
        arithmetic."""
        assert self.inside is not None
        with self.inside.gathered(record):
            t0 = time.perf_counter()
            calls = self.inside.calls(record, self.plan.eager.count)
            self.tick("children_compiled", t0)
            for call in calls.values():
                self.held_or_not(lambda call=call: self._child(record, call))

    def _child(self, record: BlockRecord, call: submodules.ChildCall) -> None:
        t0 = time.perf_counter()
        with precision.eager(), precision.autocast_as(self.device, record.autocast):
            eager = submodules.replay_child(call, None)
        self.tick("children_eager", t0)
        t0 = time.perf_counter()
        with precision.retyped([call.module], self.reference.dtype), precision.eager(), \
                precision.reference_arithmetic(self.reference, self.held, self.device,
                                               [call.module]):
            ref = submodules.replay_child(call, self.reference.dtype)
        self.tick("children_reference", t0)
        submodules.compare(self.acc, record.key, call, eager, ref, self.rtol)

    def _block_names(self, record: BlockRecord) -> list[tuple[str, nn.Parameter]]:
        at = f"layers.{record.key}"
        return [(f"{at}.{clean_name(n)}", p) for n, p in record.module.named_parameters()]

    def _bounds(self, record: BlockRecord, runs: int) -> list[tuple[int, int]]:
        rows = rows_of(record)
        if runs > 1 and not sliceable(record):
            raise AuditError(f"block {record.key}'s inputs cannot be cut into runs of rows "
                             f"(varlen metadata indexes the whole batch), and {runs} runs "
                             "were asked for or needed to fit: audit fewer tokens "
                             "(--tokens N) or on more GPUs")
        return row_bounds(rows, runs)

    def _block_eager(self, record: BlockRecord) -> _EagerBlock:
        names = self._block_names(record)
        self.restore()
        t0 = time.perf_counter()
        with precision.eager(), precision.autocast_as(self.device, record.autocast):
            runs = [replay_block(record, lo, hi, None)
                    for lo, hi in self._bounds(record, self.plan.eager.count)]
        self.tick("blocks_eager", t0)
        eager = _EagerBlock(joined(runs), {n: p.grad for n, p in names})
        for _, p in names:
            p.grad = None
        return eager

    def _block_reference(self, record: BlockRecord, eager: _EagerBlock) -> None:
        module, names = record.module, self._block_names(record)
        scratch = Accumulator(self.settings, self.device)  # merged once the block ran
        self.restore()
        t0 = time.perf_counter()
        with precision.retyped([module], self.reference.dtype), precision.eager():
            for lo, hi in self._bounds(record, self.plan.chunks.count):
                with precision.reference_arithmetic(self.reference, self.held, self.device,
                                                    [module]):
                    ref_run = replay_block(record, lo, hi, self.reference.dtype)
                self._compare_run(record, lo, hi, eager.replay, ref_run, scratch)
            ref_grads = {n: p.grad for n, p in names}
        self.tick("blocks_reference", t0)
        for n, p in names:
            p.grad = None
            scratch.add(n, record.key, "param_grad", self.job.get(n), eager.grads[n],
                        ref_grads.get(n), self.rtol)
        fsdp.reshard([module])
        self.acc.absorb(scratch)

    def _compare_run(self, record: BlockRecord, lo: int, hi: int, eager_run: BlockReplay,
                     ref_run: BlockReplay, acc: Accumulator) -> None:
        at, rtol = f"layers.{record.key}", self.rtol
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

    # -- the parts outside the blocks ------------------------------------------------------

    def outside(self) -> tuple[float, float]:
        """The parts outside the blocks, teacher-forced; returns the head's loss (eager,
        reference)."""
        facts = self._outside_facts()

        def both() -> tuple[float, float]:
            eager = self.retrying(self.plan.outside_eager, self.rows,
                                  "outside-the-blocks eager", lambda: self._outside_eager(facts))
            ref_loss = self.retrying(self.plan.outside, self.rows, "outside-the-blocks reference",
                                     lambda: self._outside_reference(facts, eager))
            return eager.loss, ref_loss

        result = self.held_or_not(both)
        self.restore()
        return result

    def _outside_facts(self) -> _Outside:
        records = list(self.records.values())
        inside = {id(p) for r in records for p in r.module.parameters()}
        params = [(n, p) for n, p in self.named if id(p) not in inside]
        first, last = records[0], records[-1]
        return _Outside(
            params=params, where=self._outside_segments(params), first=first, last=last,
            last_out=next((i for i, o in enumerate(last.outputs) if isinstance(o, torch.Tensor)
                           and i in last.grad_outputs), None),
            lead=tuple(first.hidden().shape[:2]) if first.hidden() is not None else (),
            cuttable=all(sliceable(r) for r in records))

    def _outside_segments(self, outside: list[tuple[str, nn.Parameter]]) -> dict[str, str]:
        """Children declared before ``layers`` are the embedding (TorchTitan declares them in call
        order), the rest the head; a tied weight is named once."""
        before: set[str] = set()
        for part in self.model_parts:
            for name, _ in part.named_children():
                if name == "layers":
                    break
                before.add(name)
        return {name: EMBEDDING if name.split(".", 1)[0] in before else HEAD
                for name, _ in outside}

    def _outside_pass(self, facts: _Outside, dtype: torch.dtype | None,
                      runs: int) -> _OutsidePass:
        self.restore()
        total, stands = 0.0, []
        input_dict, labels = self.batch
        for lo, hi in row_bounds(self.rows, runs if facts.cuttable else 1):
            stand = StandIn(self.records, lo, hi, dtype)
            batch = cut_batch(input_dict, labels, lambda t, lo=lo, hi=hi: t[lo:hi])
            with blocks.intercepting(stand):
                loss = self.kit.run(*batch)
            total += float(loss.detach().double().sum())
            stands.append(stand)
        grads = {n: p.grad for n, p in facts.params}
        for _, p in facts.params:
            p.grad = None
        return _OutsidePass(total, stands, grads)

    def _outside_eager(self, facts: _Outside) -> _OutsidePass:
        # Whole, as the job ran it (see block): the parameters' gradients round alike.
        with precision.eager():
            eager = self._outside_pass(facts, None, self.plan.outside_eager.count)
        eager.first = _stitched(eager.stands, lambda s: s.first_input[0] if s.first_input
                                else None)
        if facts.last_out is not None:
            at = _tensor_index(facts.last.outputs, facts.last_out)
            eager.last = _stitched(eager.stands, lambda s: s.last_grad[0][at] if s.last_grad
                                   else None)
        return eager

    def _outside_reference(self, facts: _Outside, eager: _OutsidePass) -> float:
        blocks_ = [r.module for r in self.records.values()]
        with precision.retyped(self.model_parts, self.reference.dtype, exclude=blocks_), \
                precision.eager(), self.kit.reference(), \
                precision.reference_arithmetic(self.reference, self.held, self.device,
                                               self.model_parts):
            ref = self._outside_pass(facts, self.reference.dtype, self.plan.outside.count)
        scratch = Accumulator(self.settings, self.device)
        for stand in ref.stands:
            self._compare_ends(facts, eager, stand, scratch)
        for n, _ in facts.params:
            scratch.add(n, facts.where.get(n, HEAD), "param_grad", self.job.get(n),
                        eager.grads[n], ref.grads[n], self.rtol)
        self.acc.absorb(scratch)
        return ref.loss

    def _compare_ends(self, facts: _Outside, eager: _OutsidePass, r: StandIn,
                      scratch: Accumulator) -> None:
        lo, hi, lead, last = r.lo, r.hi, facts.lead, facts.last
        hidden = facts.first.hidden()
        if hidden is not None and eager.first is not None and r.first_input:
            scratch.add("embedding output", EMBEDDING, "output",
                        cut(hidden, lead, lo, hi), cut(eager.first, lead, lo, hi),
                        r.first_input[0], self.rtol)
        if facts.last_out is not None and eager.last is not None and r.last_grad:
            scratch.add("head input grad", HEAD, "input_grad",
                        cut(last.grad_outputs[facts.last_out], lead, lo, hi),
                        cut(eager.last, lead, lo, hi),
                        r.last_grad[0][_tensor_index(last.outputs, facts.last_out)], self.rtol)

    # -- end to end ------------------------------------------------------------------------

    def end_to_end(self) -> dict[str, float]:
        """Forward-only whole-model losses, eager and in the reference's arithmetic."""
        result = self.held_or_not(lambda: self.retrying(
            self.plan.outside, self.rows, "end-to-end", self._end_to_end_once))
        self.restore()
        return result

    def _end_to_end_once(self) -> dict[str, float]:
        block_modules = [r.module for r in self.records.values()]
        with precision.eager():
            eager = self._forward_loss()
        per_block = _PerBlockRetype(block_modules, self.reference.dtype)
        with precision.retyped(self.model_parts, self.reference.dtype, exclude=block_modules), \
                precision.eager(), self.kit.reference(), blocks.intercepting(per_block), \
                precision.reference_arithmetic(self.reference, self.held, self.device,
                                               self.model_parts):
            ref = self._forward_loss()
        return {"eager": eager, "reference": ref}

    def _forward_loss(self) -> float:
        self.restore()
        total = 0.0
        input_dict, labels = self.batch
        for lo, hi in row_bounds(self.rows, self.plan.outside.count if all(
                sliceable(r) for r in self.records.values()) else 1):
            batch = cut_batch(input_dict, labels, lambda t, lo=lo, hi=hi: t[lo:hi])
            with torch.no_grad():
                total += float(self.kit.forward(*batch).detach().double().sum())
        return total


def _stitched(stands: list[StandIn],
              piece: Callable[[StandIn], torch.Tensor | None]) -> torch.Tensor | None:
    pieces = [piece(s) for s in stands]
    if any(p is None for p in pieces):
        return None
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


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
    return sum(isinstance(t, torch.Tensor) for t in leaves[:index])
