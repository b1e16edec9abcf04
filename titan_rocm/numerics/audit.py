"""The audit on a built TorchTitan trainer: one micro-batch, three forward+backward passes.

(a) the job as configured (compiled, its precision, every converter), (b) the same model
eager at the job's precision (``torch.compiler.set_stance("force_eager")``: every
``torch.compile`` wrapper runs its original Python), (c) eager in float64 (float32 under
FSDP, whose sharded parameters cannot be re-typed in place): floating parameters and
buffers re-typed in place (``.data`` swapped, the original tensors put back untouched: the
round trip is exact), autocast off, FSDP's gradient reduce dtype raised, and the model's own
casts to bfloat16/float16 held at the reference's dtype (:class:`HeldPrecision`: TorchTitan's
MoE experts cast to bfloat16 whatever the parameters' dtype). FSDP with a parameter dtype
below float32 is refused (FSDP2 allocates its all-gather buffers in it).

Everything the passes touch is put back: each parameter's ``.grad`` (the tensor itself),
every RNG stream (CPU and each CUDA device) and buffer value (before each pass too), the
trainer's autocast context and FSDP's dtypes. Nothing is stepped, saved or written. Which
trainer methods run: TorchTitan's own ``post_dataloading_process`` and
``forward_backward_step`` (0.2.2: keyword arguments ``input_dict``, ``labels``,
``global_valid_tokens``), given as ``step`` by the caller.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.numerics import fsdp
from titan_rocm.numerics.attribution import Attribution, attribute, clean_name
from titan_rocm.numerics.fsdp import is_fsdp
from titan_rocm.numerics.held_precision import HeldPrecision
from titan_rocm.numerics.stats import AuditSettings, ParamStats, compare, loss_verdict

SCHEMA = 1
"""Version of :meth:`AuditResult.to_dict`'s layout (keys are only ever added)."""

Step = Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]
"""One micro-batch's forward and backward as the trainer runs it; returns the loss."""


OUTSIDE = "(outside blocks)"
"""The ``block`` of the parameters outside ``model.layers`` (embedding, final norm, output)."""


class AuditError(RuntimeError):
    """The audit cannot run (the message is one sentence saying why): exit 2."""


@dataclass
class AuditResult:
    """What one audit found; :meth:`to_dict` is the ``--json`` object (schema 1)."""

    world_size: int
    tokens: int
    reference_dtype: str
    job_dtype: str
    settings: AuditSettings
    loss: dict[str, Any]
    parameters: list[ParamStats]
    attribution: Attribution
    time_s: dict[str, float]
    peak_memory_bytes: int | None
    notes: list[str] = field(default_factory=list)
    chunks: dict[str, int] = field(default_factory=dict)
    """Into how many runs of whole rows each pass split the micro-batch (the job's: 1)."""

    @property
    def flagged(self) -> bool:
        """The loss or any parameter flagged."""
        return bool(self.loss["flagged"]) or any(p.flagged for p in self.parameters)

    def blocks(self) -> list[dict[str, Any]]:
        """Per block (``None``: parameters outside blocks): flagged names, worst ratio; the
        blocks with flagged parameters first, worst first."""
        groups: dict[str | None, list[ParamStats]] = {}
        for p in self.parameters:
            groups.setdefault(self.attribution.block_of(p.name), []).append(p)
        rows = []
        for block, params in groups.items():
            ratios = [p.ratio for p in params if not math.isnan(p.ratio)]
            rows.append({
                "block": block if block is not None else OUTSIDE,
                "compiled": self.attribution.block_compiled(block),
                "scope": self.attribution.block_scope(block),
                "workarounds": self.attribution.block_workarounds(block),
                "flagged": [p.name for p in params if p.flagged],
                "worst_ratio": max(ratios) if ratios else 0.0,
            })
        rows.sort(key=lambda r: (not r["flagged"], -r["worst_ratio"]))
        return rows

    def origin(self) -> str | None:
        """The flagged block deepest in the forward order: errors made in a block's backward
        flow on into every earlier block's gradients, so the deepest one is where to look."""
        flagged = [b["block"] for b in self.blocks() if b["flagged"]]
        blocks = [b for b in flagged if b != OUTSIDE]
        if not blocks:
            return flagged[0] if flagged else None
        return max(blocks, key=self.attribution.order)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object: schema 1, with an ``exit_code`` of 0 (ok) or 1 (flagged)."""
        flagged = self.flagged
        parameters = []
        for p in self.parameters:
            row = p.to_dict()
            row["block"] = self.attribution.block_of(p.name)
            row["compiled"] = self.attribution.compiled(p.name)
            row["workarounds"] = self.attribution.workarounds(p.name)
            parameters.append(row)
        return {
            "schema": SCHEMA, "command": "audit", "verdict": "flagged" if flagged else "ok",
            "exit_code": 1 if flagged else 0, "error": None,
            "world_size": self.world_size, "tokens": self.tokens,
            "reference_dtype": self.reference_dtype, "job_dtype": self.job_dtype,
            "settings": self.settings.to_dict(), "loss": self.loss,
            "parameters": parameters, "blocks": self.blocks(), "origin": self.origin(),
            "workarounds_applied": self.attribution.applied,
            "time_s": self.time_s, "peak_memory_bytes": self.peak_memory_bytes,
            "notes": self.notes, "chunks": self.chunks,
        }


def error_dict(message: str, world_size: int = 1) -> dict[str, Any]:
    """The ``--json`` object of an audit that could not run (exit 2): every key, empty."""
    return {
        "schema": SCHEMA, "command": "audit", "verdict": "error", "exit_code": 2,
        "error": message,
        "world_size": world_size, "tokens": 0, "reference_dtype": None, "job_dtype": None,
        "settings": {}, "loss": None, "parameters": [], "blocks": [], "origin": None,
        "workarounds_applied": [], "time_s": {}, "peak_memory_bytes": None, "notes": [],
        "chunks": {},
    }


# ---------------------------------------------------------------- the trainer's state


@contextlib.contextmanager
def preserved_rng(devices: list[torch.device]) -> Iterator[Callable[[], None]]:
    """Yield a function that puts every RNG stream back where it was on entry; called again
    on exit, so nothing the passes draw shows in the training's streams."""
    cpu = torch.get_rng_state()
    cuda = {d.index: torch.cuda.get_rng_state(d) for d in devices if d.type == "cuda"}

    def restore() -> None:
        torch.set_rng_state(cpu)
        for index, state in cuda.items():
            torch.cuda.set_rng_state(state, index)

    try:
        yield restore
    finally:
        restore()


@contextlib.contextmanager
def preserved_grads(params: list[nn.Parameter]) -> Iterator[None]:
    """Take every ``.grad`` away for the passes and give the same tensors back after."""
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, g in zip(params, saved, strict=True):
            p.grad = None
            p.grad = g


def job_dtype_of(trainer: Any, params: list[nn.Parameter]) -> torch.dtype:
    """The dtype the job computes in: its autocast, else FSDP's (read per parameter:
    :func:`~titan_rocm.numerics.fsdp.compute_dtype`), else the parameters' own."""
    amp = getattr(trainer, "maybe_enable_amp", None)
    if isinstance(amp, torch.autocast) and amp._enabled:
        return amp.fast_dtype
    try:
        fsdp_dtype = fsdp.compute_dtype(trainer.model_parts)
    except fsdp.FSDPLayoutError as exc:
        raise AuditError(str(exc)) from None
    if fsdp_dtype is not None:
        return fsdp_dtype
    floating = [p.dtype for p in params if p.is_floating_point()]
    return floating[0] if floating else torch.float32


@contextlib.contextmanager
def high_precision(trainer: Any, dtype: torch.dtype) -> Iterator[None]:
    """Run the trainer's passes in ``dtype``: parameters and floating buffers re-typed in
    place (not under FSDP: its parameters stay, its compute and reduce dtypes are raised to
    theirs), autocast off; everything put back exactly on exit."""
    saved_amp = getattr(trainer, "maybe_enable_amp", None)
    retyped: list[tuple[torch.Tensor, torch.Tensor]] = []
    stack = contextlib.ExitStack()
    try:
        trainer.maybe_enable_amp = contextlib.nullcontext()
        try:
            groups = fsdp.param_groups(trainer.model_parts)
            if groups:
                stack.enter_context(fsdp.raised_to_sharded_dtype(trainer.model_parts))
        except fsdp.FSDPLayoutError as exc:
            raise AuditError(str(exc)) from None
        if not groups:
            for part in trainer.model_parts:
                tensors = list(part.parameters()) + list(part.buffers())
                for t in tensors:
                    if t.is_floating_point() and t.dtype != dtype:
                        retyped.append((t, t.data))
                        t.data = t.data.to(dtype)
                    elif t.is_complex() and dtype == torch.float64 and t.dtype != torch.complex128:
                        retyped.append((t, t.data))
                        t.data = t.data.to(torch.complex128)
        yield
    finally:
        for t, data in reversed(retyped):
            if isinstance(t, nn.Parameter):
                t.grad = None
            t.data = data
        stack.close()
        trainer.maybe_enable_amp = saved_amp


# ---------------------------------------------------------------- the three passes


@contextlib.contextmanager
def _restored(buffers: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[Callable[[], None]]:
    """Yield a function that puts every buffer's value back (in place); called again after
    the passes: forward passes update some (MoE token counts that the expert-bias update
    reads before the optimizer step)."""

    def restore() -> None:
        with torch.no_grad():
            for b, value in buffers:
                b.copy_(value)

    try:
        yield restore
    finally:
        restore()


def _cut(input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
         cut: Callable[[torch.Tensor], torch.Tensor]) -> tuple[dict[str, torch.Tensor],
                                                               torch.Tensor]:
    """``cut`` applied to the labels and to every input tensor that has their batch rows."""
    batch = labels.shape[0]

    def one(t: Any) -> Any:
        return cut(t) if isinstance(t, torch.Tensor) and t.shape[:1] == (batch,) else t

    return {k: one(v) for k, v in input_dict.items()}, cut(labels)


def take_tokens(input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
                tokens: int | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The first ``tokens`` label positions of the micro-batch (whole rows while they fit,
    else the first ``tokens`` of row 0); the whole micro-batch for None."""
    if tokens is None or tokens >= labels.numel():
        return input_dict, labels
    batch, seq = labels.shape[0], labels.shape[-1]
    rows = tokens // seq
    if rows >= 1:
        return _cut(input_dict, labels, lambda t: t[:rows])
    return _cut(input_dict, labels,
                lambda t: t[:1, :tokens] if t.dim() >= 2 and t.shape[:2] == (batch, seq) else t)


def row_chunks(input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
               chunks: int) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """The micro-batch as ``chunks`` runs of whole rows, as even as possible, in order.

    Run one after another into the same ``.grad`` tensors, they give the whole micro-batch's
    gradients: TorchTitan's loss is each token's loss summed over the step's global token
    count (0.2.2 ``forward_backward_step``, 0.3.0 ``_forward_backward_body``), which the
    step fixes before the passes, and the rows of an LLM's batch do not see each other.
    """
    rows = labels.shape[0]
    chunks = max(1, min(chunks, rows))
    bounds = [round(i * rows / chunks) for i in range(chunks + 1)]
    return [_cut(input_dict, labels, lambda t, lo=lo, hi=hi: t[lo:hi])
            for lo, hi in zip(bounds, bounds[1:], strict=False)]


def _memory(devices: list[torch.device]) -> int | None:
    cuda = [d for d in devices if d.type == "cuda"]
    if not cuda:
        return None
    return max(torch.cuda.max_memory_allocated(d) for d in cuda)


def _free_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        # Blocks the caching allocator holds but no tensor uses are free to the reference too.
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(torch.cuda.mem_get_info(device)[0]) + max(0, int(cached))
    try:
        import os

        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def reference_plan(trainer: Any, params: list[nn.Parameter], device: torch.device,
                   job_activation_bytes: int, rows: int) -> tuple[torch.dtype, int]:
    """The reference's dtype and into how many runs of rows it splits the micro-batch:
    float64 where it fits (FSDP: float32), whole where it fits; estimated before allocating.

    The reference keeps the job's and eager's gradients (2 x parameter bytes), its own
    (reference bytes) and, unsharded, a re-typed copy of the parameters: that much must fit
    whole. Its activations are the job pass's scaled by the dtype widths, and shrink with the
    rows each run holds (:func:`row_chunks`). The estimate cannot see an op that saves more in
    eager than compiled (attention falls back to its math kernel in float64, which keeps the
    scores): the passes retry in more runs of rows when one runs out of memory anyway.

    Raises:
        AuditError: not even the float32 reference would fit, one row at a time.
    """
    if device.type == "mps":
        candidates = [torch.float32]  # MPS has no float64
    elif is_fsdp(trainer.model_parts):
        candidates = [torch.float32]
    else:
        candidates = [torch.float64, torch.float32]
    free = _free_bytes(device)
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    numel = sum(p.numel() for p in params)
    job_width = max(1, job_dtype_of(trainer, params).itemsize)
    for dtype in candidates:
        width = dtype.itemsize
        fixed = 2 * param_bytes + 2 * numel * width
        activations = job_activation_bytes * width // job_width
        if free is None or fixed + activations <= free:
            return dtype, 1
        if fixed < free:
            chunks = math.ceil(activations / (free - fixed))
            if chunks <= rows:
                return dtype, chunks
        last = (dtype, fixed + activations // max(1, rows))
    dtype, need = last
    raise AuditError(
        f"the {str(dtype).removeprefix('torch.')} reference would need about "
        f"{need / 2**30:.1f} GiB on {device}, one row at a time, and "
        f"{free / 2**30:.1f} GiB are free: audit fewer tokens (--tokens N) or on more GPUs"
    )


OUT_OF_MEMORY: type[BaseException] = getattr(torch, "OutOfMemoryError",
                                             torch.cuda.OutOfMemoryError)
"""What torch raises when an allocation fails (``torch.cuda.OutOfMemoryError`` before 2.5)."""


def _out_of_memory(exc: BaseException) -> bool:
    """An allocation failure, also where a wrapper (a compiler, a checkpoint) re-raised it."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, OUT_OF_MEMORY):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_passes(
    trainer: Any,
    step: Step,
    input_dict: dict[str, torch.Tensor],
    labels: torch.Tensor,
    settings: AuditSettings,
    chunks: int | None = None,
) -> AuditResult:
    """The three passes and their statistics, with the trainer's state preserved (see the
    module docstring). Collective: every rank calls it with its own micro-batch.

    ``chunks``: into how many runs of whole rows the eager and reference passes split the
    micro-batch (:func:`row_chunks`; their gradients are the whole micro-batch's either way);
    None (auto): whole where the estimate says it fits, and, in one process, twice as many
    runs after a pass runs out of memory, down to one row per run. The job pass always runs
    the whole micro-batch: its kernels (a tuned GEMM table among them) are chosen for it."""
    import torch.distributed as dist

    model_parts: list[nn.Module] = list(trainer.model_parts)
    named = [(clean_name(n), p) for part in model_parts for n, p in part.named_parameters()]
    params = [p for _, p in named]
    device = torch.device(getattr(trainer, "device", "cpu"))
    devices = [device]
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    rows = int(labels.shape[0]) if labels.dim() else 1
    if chunks is not None and not 1 <= chunks <= rows:
        raise AuditError(f"--reference-chunks {chunks} is not valid for this micro-batch; "
                         f"accepted: a whole number from 1 to its {rows} row(s)")
    job_dtype = job_dtype_of(trainer, params)
    times: dict[str, float] = {}
    losses: dict[str, float] = {}
    grads: dict[str, dict[str, torch.Tensor | None]] = {}
    used: dict[str, int] = {}
    started = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    base = _memory(devices) or 0

    def one(kind: str, context: Callable[[], contextlib.AbstractContextManager[Any]],
            runs: int) -> None:
        restore_rng()
        restore_buffers()  # every pass sees the state the job pass saw
        for p in params:
            p.grad = None
        t0 = time.perf_counter()
        with context():
            total = 0.0
            for inputs, chunk_labels in row_chunks(input_dict, labels, runs):
                loss = step(dict(inputs), chunk_labels)
                total += float(loss.detach().double().sum())
                del loss
            grads[kind] = {n: (None if p.grad is None else p.grad.detach().clone())
                           for n, p in named}
            losses[kind] = total
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times[kind] = time.perf_counter() - t0
        used[kind] = runs
        for p in params:
            p.grad = None

    def passes(kind: str, context: Callable[[], contextlib.AbstractContextManager[Any]],
               runs: int, adaptive: bool) -> None:
        """``one`` pass, in more runs of rows after running out of memory (``adaptive``)."""
        while True:
            try:
                one(kind, context, runs)
                return
            except Exception as exc:
                if not _out_of_memory(exc):
                    raise
                first = _first_line(exc)
            for p in params:
                p.grad = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if not adaptive or runs >= rows:
                where = (f" in {runs} runs of rows" if runs > 1 else "")
                hint = ("audit fewer tokens (--tokens N) or on more GPUs" if runs >= rows else
                        f"audit with --reference-chunks N (up to the micro-batch's {rows} "
                        "rows), fewer tokens (--tokens N) or on more GPUs")
                raise AuditError(f"the {kind} pass ran out of memory on {device}{where} "
                                 f"({first}): {hint}") from None
            runs = min(rows, runs * 2)
            # Not torch's own words: check-log reads "CUDA out of memory" as the job's crash.
            asked = re.search(r"Tried to allocate [\d.]+ \w+", first)
            log.info("numerics audit: the %s pass did not fit (%s); running it again in %d "
                     "runs of rows", kind, asked.group(0) if asked else "an allocation failed",
                     runs)

    # One process retries in more runs after running out of memory; ranks cannot (one rank's
    # failure leaves the others waiting in a collective), so they agree on a count up front.
    adaptive = chunks is None and world == 1

    def agreed(runs: int) -> int:
        if world > 1 and chunks is None:
            count = torch.tensor([runs], dtype=torch.int64, device=device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            return int(count)
        return runs

    buffers = [(b, b.detach().clone()) for part in model_parts for b in part.buffers()]
    notes: list[str] = []
    eager = lambda: torch.compiler.set_stance("force_eager")  # noqa: E731
    with preserved_rng(devices) as restore_rng, preserved_grads(params), \
            _restored(buffers) as restore_buffers:
        try:
            one("job", contextlib.nullcontext, 1)
        except Exception as exc:
            if not _out_of_memory(exc):
                raise
            raise AuditError(f"the job pass ran out of memory on {device} "
                             f"({_first_line(exc)}): audit fewer tokens (--tokens N) or on "
                             "more GPUs") from None
        # The job pass's peak holds its own gradients too; the estimate counts those apart.
        grad_bytes = sum(p.numel() * p.element_size() for p in params)
        activations = max(0, (_memory(devices) or 0) - base - grad_bytes)
        passes("eager", eager, agreed(chunks or 1), adaptive)
        ref_dtype, planned = reference_plan(trainer, params, device, activations, rows)
        with high_precision(trainer, ref_dtype):
            runs = agreed(chunks or max(planned, used["eager"]))
            notes += _reference_pass(lambda context: passes("reference", context, runs,
                                                            adaptive), ref_dtype)
    if world > 1:
        # Each rank's loss is its local sum over the global token count: summed, the job's
        # loss (replicated ranks scale all three alike, which relative errors do not see).
        summed = torch.tensor([losses[k] for k in ("job", "eager", "reference")],
                              dtype=torch.float64, device=device)
        dist.all_reduce(summed)
        losses.update(zip(("job", "eager", "reference"), summed.tolist(), strict=True))
    names = [n for n, _ in named]
    stats = compare(names, grads["job"], grads["eager"], grads["reference"], job_dtype,
                    settings, device)
    loss = loss_verdict(losses["job"], losses["eager"], losses["reference"], job_dtype,
                        settings)
    times["total"] = time.perf_counter() - started
    tokens = int(labels.numel())
    if world > 1:
        counted = torch.tensor([tokens], dtype=torch.int64, device=device)
        dist.all_reduce(counted)
        tokens = int(counted)
    log.info("numerics audit: %d parameters, %d tokens, reference %s, %.1f s",
             len(stats), tokens, ref_dtype, times["total"])
    attribution = attribute(model_parts)
    notes = [*attribution.notes, *notes]
    split = {k: v for k, v in used.items() if v > 1}
    if split:
        notes.append("to fit in memory, " + " and ".join(
            f"the {k} pass ran in {v} runs of rows" for k, v in split.items())
            + " (gradients accumulated: the whole micro-batch's)")
    return AuditResult(
        world_size=world, tokens=tokens,
        reference_dtype=str(ref_dtype).removeprefix("torch."),
        job_dtype=str(job_dtype).removeprefix("torch."), settings=settings, loss=loss,
        parameters=stats, attribution=attribution, time_s=times,
        peak_memory_bytes=_memory(devices), notes=notes, chunks=used,
    )


def _reference_pass(run: Callable[[Callable[[], contextlib.AbstractContextManager[Any]]], None],
                    dtype: torch.dtype) -> list[str]:
    """The reference pass (``run`` given its context's factory) with the model's own
    down-casts held (:class:`HeldPrecision`, a fresh one for each attempt of the pass);
    returns the result's notes. A kernel that refuses the held dtype (an extension taking
    bfloat16 only) gets the pass again as the model writes it, said in a note and the log."""
    held: list[HeldPrecision] = []

    @contextlib.contextmanager
    def held_eager() -> Iterator[None]:
        held.append(HeldPrecision())
        with held[-1], torch.compiler.set_stance("force_eager"):
            yield

    try:
        run(held_eager)
    except AuditError:
        raise
    except Exception as exc:  # noqa: BLE001 - any kernel's refusal; the pass is run again
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        note = (f"reference pass: the model's own down-casts could not be held at "
                f"{str(dtype).removeprefix('torch.')} ({type(exc).__name__}: {first}); the "
                "reference runs them as the model writes them, so its low-precision parts "
                "are judged against themselves")
        log.warning("numerics audit: %s", note)
        run(lambda: torch.compiler.set_stance("force_eager"))
        return [note]
    return held[-1].notes(dtype)


# ---------------------------------------------------------------- TorchTitan 0.2.2


def global_valid_tokens(trainer: Any, labels: torch.Tensor) -> torch.Tensor:
    """The loss denominator ``Trainer.train_step`` computes (0.2.2): valid labels, summed
    over the batch mesh when data parallel."""
    from torchtitan.components.loss import IGNORE_INDEX

    local = (labels != IGNORE_INDEX).sum().to(labels.device)
    dims = trainer.parallel_dims
    if getattr(dims, "dp_enabled", False):
        from torchtitan.distributed import utils as dist_utils

        return dist_utils.dist_sum(local, dims.get_mesh("batch"))
    return local.float()


def trainer_step(trainer: Any, labels: torch.Tensor) -> Step:
    """TorchTitan 0.2.2's ``forward_backward_step`` of ``trainer`` as a :data:`Step`."""
    denominator = global_valid_tokens(trainer, labels)

    def step(input_dict: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        return trainer.forward_backward_step(input_dict=input_dict, labels=labels,
                                             global_valid_tokens=denominator)

    return step


def refuse_unsupported(trainer: Any) -> None:
    """Raise :class:`AuditError` for a layout the audit does not cover.

    Pipeline parallelism is refused: each stage holds other parameters and the schedule runs
    several micro-batches per call, so the three passes would not see one shared batch.
    """
    dims = getattr(trainer, "parallel_dims", None)
    if getattr(dims, "pp_enabled", False):
        raise AuditError("pipeline parallelism is not audited (each stage holds other "
                         "parameters and its schedule splits the batch): audit the job with "
                         "--parallelism.pipeline_parallel_degree 1 on fewer layers or more "
                         "memory per GPU")


def audit_micro_batch(trainer: Any, step_of: Callable[[Any, torch.Tensor], Step],
                      input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
                      settings: AuditSettings, tokens: int | None = None,
                      chunks: int | None = None) -> AuditResult:
    """Audit a built trainer on one micro-batch (its first ``tokens``), moved to the trainer's
    device, with the step ``step_of(trainer, labels)`` makes (each TorchTitan generation's
    own); ``chunks`` as :func:`run_passes` takes it.

    Raises:
        AuditError: pipeline parallelism, or the reference would not fit (one sentence).
    """
    refuse_unsupported(trainer)
    device = torch.device(getattr(trainer, "device", "cpu"))
    input_dict, labels = take_tokens(input_dict, labels, tokens)
    input_dict = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                  for k, v in input_dict.items()}
    labels = labels.to(device)
    return run_passes(trainer, step_of(trainer, labels), input_dict, labels, settings, chunks)


def audit_022(trainer: Any, input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
              settings: AuditSettings, tokens: int | None = None,
              chunks: int | None = None) -> AuditResult:
    """Audit a built TorchTitan 0.2.2 trainer on one micro-batch (:func:`audit_micro_batch`
    with 0.2.2's ``forward_backward_step``)."""
    return audit_micro_batch(trainer, trainer_step, input_dict, labels, settings, tokens,
                             chunks)
