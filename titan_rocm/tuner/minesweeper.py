"""The minesweeper: the one process that runs candidate kernels, checked against ATen and a float64
reference before timing (docs/validated-tuning.md).

After a device error it exits: a device that saw one is not trusted with the next candidate."""

from __future__ import annotations

import json
import math
import os
import re
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from titan_rocm import patches
from titan_rocm.tuned_gemms.env import environment
from titan_rocm.tuned_gemms.problems import Problem, TensorSpec
from titan_rocm.tuned_gemms.records import task_id

EXIT_RETIRED = 17
"""Exit status after a device error was reported: not a crash."""

DEFAULT_ATOL: dict[str, float] = {
    "torch.float32": 1e-5, "torch.float16": 1e-3, "torch.bfloat16": 1e-2,
    "torch.float64": 1e-12, "torch.int32": 0.0,
}
"""Absolute tolerance per output dtype, per unit of the reference's largest magnitude."""


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _reference(op: str, args: list[Any], scalars: dict[str, Any]) -> Any:
    import torch

    alpha, beta = scalars.get("alpha", 1), scalars.get("beta", 1)
    if op == "mm":
        return torch.mm(args[0], args[1])
    if op == "bmm":
        return torch.bmm(args[0], args[1])
    if op == "addmm":
        return torch.addmm(args[0], args[1], args[2], beta=beta, alpha=alpha)
    if op == "baddbmm":
        return torch.baddbmm(args[0], args[1], args[2], beta=beta, alpha=alpha)
    if op == "mm_plus_mm":
        return torch.mm(args[0], args[1]) + torch.mm(args[2], args[3])
    if op == "int_mm":
        if args[0].dtype == torch.float64:
            return torch.mm(args[0], args[1])
        return torch._int_mm(args[0], args[1])
    raise ValueError(f"no reference for op {op!r}")


@dataclass
class Reference:
    """The ATen result and the float64 reference of a problem, and the tolerance."""

    aten: Any
    exact: Any
    gap: float
    tolerance: float


def make_reference(problem: Problem, autotune_args: Any, fudge: float) -> Reference:
    """Compute the references from the ATen inputs Inductor made for the benchmark."""
    import torch

    inputs, out = autotune_args.get_benchmark_tensors(True).unpack()
    aten = _reference(problem.op, list(inputs), problem.scalars)
    exact = _reference(problem.op, [t.to(torch.float64) for t in inputs], problem.scalars)
    gap = float((aten.to(torch.float64) - exact).abs().max()) if aten.numel() else 0.0
    scale = max(1.0, float(exact.abs().max())) if exact.numel() else 1.0
    atol = DEFAULT_ATOL.get(str(out.dtype), 1e-2) * scale
    return Reference(aten, exact, gap, fudge * max(gap, atol))


def _fill(out: Any) -> None:
    import torch

    if out.dtype.is_floating_point:
        out.fill_(float("nan"))
    else:
        out.fill_(torch.iinfo(out.dtype).min)


def _runner(choice: Any, inputs: list[Any], out: Any) -> tuple[Any, Any]:
    target, args, dest = choice, list(inputs), out
    pre = getattr(choice, "_preprocessor", None)  # DataProcessorChoiceCallerWrapper (CPP)
    post = getattr(choice, "_postprocessor", None)
    if pre is not None:
        target = choice._wrapped
        args, dest = pre(args, out)
    bmreq = vars(target).get("bmreq") if hasattr(target, "__dict__") else None
    if bmreq is None:  # no request of its own (older ATen callers): its benchmark runs it
        return (lambda: target.benchmark(*args, out=dest)), (lambda: None)
    fn = bmreq.make_run_fn(*args, out=dest)

    def run() -> None:
        # ``fn`` may hold raw pointers (CPP kernels): keep the tensors alive while it runs.
        keep = (args, dest)  # noqa: F841
        fn()
        if dest is not out:
            out.copy_(post(dest) if post is not None else dest)

    return run, bmreq.cleanup_run_fn


def _classify(error: BaseException) -> str:
    return "compile_error" if isinstance(error, (ImportError, SyntaxError)) else "cuda_error"


@dataclass
class Candidate:
    """One candidate of the problem being tuned."""

    choice: Any
    task: str
    template_id: str
    params: dict[str, Any]
    template_hash: str | None
    call_key: str
    representable: bool

    def record(self, problem: Problem) -> dict[str, Any]:
        """The identity fields every record of this task carries."""
        return {"task": self.task, "key": problem.key, "op": problem.op,
                "call_key": self.call_key, "template_id": self.template_id,
                "params": self.params, "template_hash": self.template_hash,
                "representable": self.representable}


def _json_params(params: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    text = json.dumps(params, sort_keys=True, default=str)
    back = json.loads(text)
    return back, back == params


def candidates_of(problem: Problem, choices: list[Any], env: dict[str, Any]) -> list[Candidate]:
    """Identify each ChoiceCaller of a lowering as a task (duplicates dropped)."""
    from titan_rocm.tuned_gemms.choices import ktc_of

    owner = {}
    for call in problem.calls:
        for template in call.templates:
            owner.setdefault(template.uid, call.key)
    out, seen, others = [], set(), 0
    for choice in choices:
        ktc = ktc_of(choice)
        if ktc is not None:
            template_id = ktc.template.uid
            params, representable = _json_params(ktc.params.to_kwargs())
            template_hash = getattr(ktc.template, "src_hash", None)
        else:  # appended after the choices handler (CPP, CK, CUTLASS): not a table entry
            name = str(getattr(choice, "name", type(choice).__name__))
            template_id = f"{name.split('_', 1)[0]}::{problem.op}"
            params, representable = {"index": others, "name": re.sub(r"_\d+$", "", name)}, False
            template_hash = None
            others += 1
        tid = task_id(problem.key, template_id, params, template_hash, env)
        if tid in seen:
            continue
        seen.add(tid)
        out.append(Candidate(choice, tid, template_id, params, template_hash,
                             owner.get(template_id, problem.key), representable))
    return out


@dataclass
class Target:
    """The problem this minesweeper is tuning, and what it has reported."""

    index: int
    problem: Problem
    skip: set[str]
    conn: Any
    env: dict[str, Any]
    fudge: float
    faults: list[Any] = field(default_factory=list)
    candidates: dict[int, Candidate] = field(default_factory=dict)
    seen: bool = False

    def on_lowering(self, problem: Problem, choices: list[Any], input_nodes: Any,
                    layout: Any) -> list[Any]:
        """EnumeratingChoices' sink: the first lowering with our key is the one tuned."""
        if self.seen or problem.key != self.problem.key:
            return choices
        self.seen = True
        cands = candidates_of(self.problem, choices, self.env)
        nth: dict[str, int] = {}
        from titan_rocm.testing import faults

        for cand in cands:
            n = nth.get(cand.template_id, 0)
            nth[cand.template_id] = n + 1
            for fault in self.faults:
                if fault.matches(cand.template_id, n, self.index):
                    faults.inject(cand.choice, fault.fault)
        self.candidates = {id(c.choice): c for c in cands}
        self.conn.send(("tasks", self.problem.key, list(problem.keys),
                        [c.record(self.problem) for c in cands]))
        if len(choices) == 1:  # Inductor does not benchmark a lone choice: check it here
            from torch._inductor.select_algorithm import AlgorithmSelectorCache

            self.validate(choices, AlgorithmSelectorCache.get_inputs(
                choices, input_nodes, layout, None))
        return choices

    def validate(self, choices: list[Any], autotune_args: Any) -> dict[Any, float]:
        """The hooked ``benchmark_choices``: check and time each of our candidates."""
        present = {id(c) for c in choices}
        for cand in self.candidates.values():
            if id(cand.choice) not in present and cand.task not in self.skip:
                self.skip.add(cand.task)
                self.conn.send(("result", {**cand.record(self.problem), "status": "compile_error",
                                           "error": "Inductor dropped it when precompiling"}))
        reference: Reference | None = None
        timings: dict[Any, float] = {}
        for choice in choices:
            cand = self.candidates.get(id(choice))
            timings[choice] = math.inf
            if cand is None or cand.task in self.skip:
                continue
            if reference is None:
                reference = make_reference(self.problem, autotune_args, self.fudge)
            self.conn.send(("started", {**cand.record(self.problem), "pid": os.getpid()}))
            answer = self.conn.recv()
            if answer == ("stop",):  # the run ends before this candidate (its writer failed)
                raise SystemExit(0)  # a normal exit: this process's semaphores are unlinked
            if answer != ("go",):
                raise RuntimeError("the worker did not answer 'go'")
            result = self.run(cand, autotune_args, reference)
            self.skip.add(cand.task)
            self.conn.send(("result", {**cand.record(self.problem), **result,
                                       "pid": os.getpid()}))
            if result["status"] == "cuda_error":
                os._exit(EXIT_RETIRED)
            if result["status"] == "pass":
                timings[choice] = result["time_ms"]
        return timings

    def run(self, cand: Candidate, autotune_args: Any, ref: Reference) -> dict[str, Any]:
        """Load, run once, check and (on a pass) time one candidate."""
        import torch

        from titan_rocm.tuned_gemms.choices import is_extern

        extern = cand.template_id.startswith("aten::") or is_extern(
            getattr(cand.choice, "choice", None))
        inputs, out = autotune_args.get_benchmark_tensors(extern).unpack()
        start = time.monotonic()
        try:
            run, cleanup = _runner(cand.choice, list(inputs), out)
        except Exception as exc:  # noqa: BLE001 - any failure to load is the candidate's
            return {"status": "compile_error", "error": _short(exc)}
        self.conn.send(("loaded",))
        try:
            _fill(out)
            run()
            _sync()
        except Exception as exc:  # noqa: BLE001 - the device may be poisoned: retire
            return {"status": _classify(exc), "error": _short(exc),
                    "elapsed_s": round(time.monotonic() - start, 3)}
        finally:
            try:
                cleanup()
            except Exception:  # noqa: BLE001,S110 - cleanup of a failed kernel
                pass
        got = out.to(torch.float64)
        fields: dict[str, Any] = {"tolerance": ref.tolerance, "reference_gap": ref.gap}
        finite_ref = torch.isfinite(ref.exact)
        if not bool(torch.isfinite(got)[finite_ref].all()):
            self.conn.send(("checked",))
            return {"status": "nan", **fields}
        diff = float((got - ref.exact).abs().max()) if got.numel() else 0.0
        fields.update(max_abs_diff=diff, max_abs_diff_aten=float(
            (got - ref.aten.to(torch.float64)).abs().max()) if got.numel() else 0.0)
        self.conn.send(("checked",))
        if not diff <= ref.tolerance:  # a NaN difference or tolerance is never a pass
            return {"status": "mismatch", **fields}
        try:
            time_ms = float(cand.choice.benchmark(*inputs, out=out))
            _sync()
        except Exception as exc:  # noqa: BLE001 - it ran once, failed when timed: retire
            return {"status": "cuda_error", "error": "when timed: " + _short(exc), **fields}
        if not math.isfinite(time_ms):
            return {"status": "cuda_error", "error": f"timing {time_ms}", **fields}
        return {"status": "pass", "time_ms": time_ms, **fields,
                "elapsed_s": round(time.monotonic() - start, 3)}


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 2000 else text[:2000] + "..."


_ACTIVE: list[Target] = []


def install_benchmark_hook() -> None:
    """Route the tuned lowering's ``benchmark_choices`` to :meth:`Target.validate` (once)."""
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    patches.patch(AlgorithmSelectorCache, "benchmark_choices", _validating, by="titan-rocm tune")


def _validating(stock: Any) -> classmethod:
    original = stock.__func__  # the classmethod as bound to the class: its function

    def benchmark_choices(cls, choices, autotune_args, *args, **kwargs):  # noqa: ANN001
        target = _ACTIVE[-1] if _ACTIVE else None
        if target is None or not any(id(c) in target.candidates for c in choices):
            return original(cls, choices, autotune_args, *args, **kwargs)
        return target.validate(list(choices), autotune_args)

    return classmethod(benchmark_choices)


def _tensor(spec: TensorSpec, device: str) -> Any:
    import torch

    dtype = getattr(torch, spec.dtype.removeprefix("torch."))
    size = 1 + spec.offset + sum((s - 1) * st for s, st in zip(spec.shape, spec.stride,
                                                                  strict=True))
    base = torch.empty(max(size, 1), dtype=dtype, device=device)
    if dtype.is_floating_point:
        base.normal_()
    else:
        base.random_(-8, 8)
    return base.as_strided(spec.shape, spec.stride, spec.offset)


def program(problem: Problem) -> Any:
    """The one-op function whose compile lowers ``problem``."""
    import torch

    alpha, beta = problem.scalars.get("alpha", 1), problem.scalars.get("beta", 1)
    return {
        "mm": lambda a, b: torch.mm(a, b),
        "bmm": lambda a, b: torch.bmm(a, b),
        "addmm": lambda i, a, b: torch.addmm(i, a, b, beta=beta, alpha=alpha),
        "baddbmm": lambda i, a, b: torch.baddbmm(i, a, b, beta=beta, alpha=alpha),
        "mm_plus_mm": lambda a, b, c, d: torch.mm(a, b) + torch.mm(c, d),
        "int_mm": lambda a, b: torch._int_mm(a, b),
    }[problem.op]


def tune_problem(conn: Any, index: int, problem: Problem, skip: set[str],
                 options: dict[str, Any], env: dict[str, Any], faults: list[Any]) -> str | None:
    """Compile ``problem``'s program with every candidate checked; an error message or None."""
    import torch

    from titan_rocm.tuned_gemms.choices import ChoicesFactory, EnumeratingChoices, install

    target = Target(index, problem, set(skip), conn, env, float(options["fudge"]), faults)
    handler = EnumeratingChoices(target.on_lowering)
    install(ChoicesFactory(lambda: handler), settings={
        "max_autotune_gemm": True,
        "max_autotune_gemm_backends": options["backends"],
        "max_autotune_gemm_search_space": options["search_space"].upper(),
    })
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = [_tensor(spec, device) for spec in problem.args]
    torch._dynamo.reset()
    _ACTIVE.append(target)
    try:
        with torch.no_grad():
            torch.compile(program(problem), fullgraph=True, dynamic=False)(*args)
    except Exception as exc:  # noqa: BLE001 - e.g. every candidate failed: results stand
        if not target.seen:
            return f"compiling the problem failed: {_short(exc)}"
    finally:
        _ACTIVE.remove(target)
    if not target.seen:
        return ("its one-op program never lowered a GEMM with this key (settings or torch "
                "differ from the job's?)")
    return None


def setup(options: dict[str, Any]) -> dict[str, Any]:
    """Configure Inductor for tuning, apply the job's codegen settings, initialise the device."""
    import torch
    import torch._inductor.config as inductor_config

    for name, value in {
        "fx_graph_cache": False, "autotune_local_cache": False, "autotune_remote_cache": False,
        "benchmark_epilogue_fusion": False, "autotune_in_subproc": False,
    }.items():
        if hasattr(inductor_config, name):
            setattr(inductor_config, name, value)
    from titan_rocm.tuner.settings import apply_codegen_settings

    apply_codegen_settings(options.get("settings") or {})
    install_benchmark_hook()
    if torch.cuda.is_available():
        torch.cuda.init()
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    return environment()


def main(conn: Any, options: dict[str, Any]) -> None:
    """Process entry: ``ready``, then one problem at a time until ``stop`` or a device error."""
    from titan_rocm.testing import faults as faults_module

    try:
        faults = faults_module.install_from_env()
        env = setup(options)
    except Exception:  # noqa: BLE001 - report why this process cannot tune
        conn.send(("failed", traceback.format_exc()[-4000:]))
        return
    conn.send(("ready", os.getpid(), env))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "stop":
            return
        _, index, problem, skip = message
        error = tune_problem(conn, index, Problem.from_dict(problem), set(skip), options, env,
                             faults)
        conn.send(("problem_done", error))
