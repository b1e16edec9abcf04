"""What the audit borrows from the process and gives back (RNG, ``.grad``, buffers), and what it
asks of it (collectives, free memory, allocation failures)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn


@contextlib.contextmanager
def preserved_rng(device: torch.device) -> Iterator[None]:
    """Every RNG stream (CPU, and the device's) as it was on entry, on exit."""
    rng = RngState(device)
    try:
        yield
    finally:
        rng.restore()


class RngState:
    """The CPU's and ``device``'s RNG streams as they are now; :meth:`restore` puts them back."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self) -> None:
        """Both streams as taken."""
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


@contextlib.contextmanager
def taken_grads(params: list[nn.Parameter]) -> Iterator[list[torch.Tensor | None]]:
    """Yield every ``.grad`` and leave None in their place; the same tensors are put back on
    exit."""
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield saved
    finally:
        for p, g in zip(params, saved, strict=True):
            p.grad = None
            p.grad = g


def put_back(buffers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Every buffer's value as it was cloned (MoE token counts grow in every forward)."""
    with torch.no_grad():
        for b, value in buffers:
            b.copy_(value)


@contextlib.contextmanager
def restoring(buffers: list[tuple[torch.Tensor, torch.Tensor]]
              ) -> Iterator[Callable[[], None]]:
    """Yield :func:`put_back`; called again on exit."""
    try:
        yield lambda: put_back(buffers)
    finally:
        put_back(buffers)


def world() -> int:
    """The ranks of the job (1 outside ``torch.distributed``)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce_max(value: int, device: torch.device) -> int:
    """The largest ``value`` of every rank (a plan every rank follows)."""
    if world() == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """``values`` summed over the ranks (in float64)."""
    if world() == 1:
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



def allocation(first: str) -> str:
    """What an out-of-memory error's first line asked for, in the audit's words."""
    # Not torch's own words: check-log reads "CUDA out of memory" as the job's crash.
    asked = re.search(r"Tried to allocate [\d.]+ \w+", first)
    return asked.group(0) if asked else "an allocation failed"
