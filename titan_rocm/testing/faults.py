"""Test-only fault injection for ``tune run``: chosen candidates misbehave
(docs/environment-variables.md, ``TITAN_ROCM_TUNE_FAULTS`` and ``TITAN_ROCM_TUNE_WRONG_MM``).

The request wrapper passes everything through, so the real kernel still compiles."""

from __future__ import annotations

import functools
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

ENV_FAULTS = "TITAN_ROCM_TUNE_FAULTS"
ENV_WRONG_MM = "TITAN_ROCM_TUNE_WRONG_MM"
ENV_MAX_MM_CONFIGS = "TITAN_ROCM_TUNE_MAX_MM_CONFIGS"
ENV_DISK_FULL = "TITAN_ROCM_TUNE_DISK_FULL_AFTER"
"""``N``: the write after the N-th record writes half a line and fails with ENOSPC, as a full
disk does (no tiny file system is needed)."""

FAULTS: dict[str, str] = {
    "wrong": "runs the kernel, then adds 1 to its output",
    "nan": "runs the kernel, then writes NaN into its output",
    "crash": "kills the process with SIGSEGV when run",
    "hang": "never returns when run",
    "raise": "raises while the kernel is loaded",
    "ima": "runs the kernel, then a store to an unmapped GPU address (illegal memory access)",
}


class FaultSpecError(ValueError):
    """``TITAN_ROCM_TUNE_FAULTS`` does not parse; the message says what is accepted."""


@dataclass(frozen=True)
class Fault:
    fault: str
    template_id: str
    nth: int = 0
    problem: int | None = None

    def matches(self, template_id: str, nth: int, problem: int) -> bool:
        """Whether the ``nth`` candidate of ``template_id`` in problem ``problem`` is chosen."""
        return (template_id == self.template_id and nth == self.nth
                and (self.problem is None or self.problem == problem))


def parse(spec: str) -> list[Fault]:
    """Parse a ``TITAN_ROCM_TUNE_FAULTS`` value (FaultSpecError for a bad item)."""
    faults = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        fault, sep, selector = item.partition(":")
        if not sep or fault not in FAULTS or not selector:
            raise FaultSpecError(
                f"{ENV_FAULTS}: {item!r} is not FAULT:TEMPLATE_ID[#N][@PROBLEM] with FAULT one "
                f"of {', '.join(FAULTS)}")
        selector, _, problem = selector.partition("@")
        template_id, _, nth = selector.partition("#")
        try:
            faults.append(Fault(fault, template_id, int(nth or 0),
                                int(problem) if problem else None))
        except ValueError:
            raise FaultSpecError(f"{ENV_FAULTS}: {item!r}: N and PROBLEM are integers") from None
    return faults


def disk_full_after() -> int | None:
    """:data:`ENV_DISK_FULL` as a record count (None: unset; FaultSpecError: not an integer >=
    0)."""
    text = os.environ.get(ENV_DISK_FULL)
    if text is None:
        return None
    if not text.strip().isdigit():
        raise FaultSpecError(f"{ENV_DISK_FULL}={text!r}: accepted: an integer >= 0")
    return int(text)


def from_env() -> list[Fault]:
    """The faults ``TITAN_ROCM_TUNE_FAULTS`` asks for (none when unset)."""
    return parse(os.environ.get(ENV_FAULTS, ""))


def _illegal_access(out: Any) -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def store_far(ptr):
        tl.store(ptr + (1 << 40), 1.0)

    store_far[(1,)](out)


def _run(fault: str, fn: Any, out: Any) -> Any:
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang":
        while True:
            time.sleep(1)
    result = fn()
    if fault == "wrong":
        out.add_(1)
    elif fault == "nan":
        out.view(-1)[0] = float("nan")
    elif fault == "ima":
        _illegal_access(out)
    return result


class FaultyRequest:
    """A benchmark request that runs the real one, then misbehaves as ``fault`` says."""

    def __init__(self, inner: Any, fault: str) -> None:
        self.inner = inner
        self.fault = fault

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "fault"):  # during unpickling, before __dict__ is filled
            raise AttributeError(name)
        return getattr(self.inner, name)

    def make_run_fn(self, *inputs: Any, out: Any) -> Any:
        """The real run function, wrapped; ``raise`` fails here, while loading."""
        if self.fault == "raise":
            raise RuntimeError("titan-rocm fault injection: raise while loading the kernel")
        fn = self.inner.make_run_fn(*inputs, out=out)
        return functools.partial(_run, self.fault, fn, out)

    def cleanup_run_fn(self) -> None:
        self.inner.cleanup_run_fn()

    def benchmark(self, *inputs: Any, out: Any = None) -> float:
        """Time the faulty run function with the real request's benchmarker."""
        fn = self.make_run_fn(*inputs, out=out)
        try:
            return self.inner.do_bench(fn, *inputs, out=out)
        finally:
            self.inner.cleanup_run_fn()


def inject(choice: Any, fault: str) -> bool:
    """Wrap ``choice``'s benchmark request; False if it has none."""
    target = getattr(choice, "_wrapped", choice)  # DataProcessorChoiceCallerWrapper
    inner = vars(target).get("bmreq") if hasattr(target, "__dict__") else None
    if inner is None:
        return False
    target.bmreq = FaultyRequest(inner, fault)
    return True


def patch_wrong_mm(blocks: tuple[int, int, int]) -> None:
    """A real kernel that is wrong and, doing a sixteenth of the work, faster than any other: the
    GPU proof that stock max-autotune picks it and the tuner rejects it."""
    import torch._inductor.kernel.mm as mm
    from torch._inductor.select_algorithm import TritonTemplate

    loop = "for k_idx in range(0, tl.cdiv(K, BLOCK_K)):"
    load = getattr(mm, "load_kernel_template", None)
    text = load("triton_mm") if load is not None else ""
    if loop not in text:
        raise RuntimeError("this torch's mm template has no K loop titan-rocm knows: "
                           "cannot inject a wrong config")
    m, n, k = blocks
    cond = f"(BLOCK_M == {m} and BLOCK_N == {n} and BLOCK_K == {k})"
    text = text.replace(loop, f"for k_idx in range(0, tl.cdiv(K, BLOCK_K) // (16 if {cond} "
                              "else 1)):")
    TritonTemplate.all_templates.pop("mm", None)  # the name must be free to register again
    mm.mm_template = TritonTemplate(name="mm", grid=mm.mm_grid, source=text,
                                    cache_codegen_enabled_for_template=True,
                                    prologue_loads_all_inputs=True)


def install_from_env() -> list[Fault]:
    """Apply ``TITAN_ROCM_TUNE_WRONG_MM`` and ``TITAN_ROCM_TUNE_MAX_MM_CONFIGS`` (fewer candidates
    per template) now; return ``TITAN_ROCM_TUNE_FAULTS``' faults."""
    cap = os.environ.get(ENV_MAX_MM_CONFIGS)
    if cap:
        import torch._inductor.config as inductor_config

        inductor_config.test_configs.max_mm_configs = int(cap)
    blocks = os.environ.get(ENV_WRONG_MM)
    if blocks:
        parts = tuple(int(x) for x in blocks.split(","))
        if len(parts) != 3:
            raise FaultSpecError(f"{ENV_WRONG_MM}={blocks!r}: expected BLOCK_M,BLOCK_N,BLOCK_K")
        patch_wrong_mm(parts)  # type: ignore[arg-type]
    return from_env()
