"""Issue 24's measurement: why 0.3.0's compiled deepseek_v3 debug audit flagged block 1's MoE.

Run in the TorchTitan 0.3.0 venv (CPU, about 3 minutes)::

    python tests/tt030/tt030_moe_precision.py            # the audit as it is
    python tests/tt030/tt030_moe_precision.py --no-hold  # the reference as before (casts run)

Prints (1) the audit's MoE rows and notes, (2) per MoE layer, how many tokens the job pass
routes to other experts than the eager and reference passes (a forward hook on every
``TokenChoiceTopKRouter``), (3) block 1's ``GroupedExperts`` alone on that micro-batch's
routed tokens and weights: eager and compiled as the model writes them (bfloat16 GEMMs), the
same function in float32, each against float64 (relative RMS of the output and gradients).
docs/numerics-audit.md quotes the figures.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from tt030_harness import force_cpu_device_type  # noqa: E402

force_cpu_device_type()

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def _trainer() -> Any:
    from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel
    from tt030_harness import Harness

    from titan_rocm.adapters.tt030 import rocm

    harness = Harness.install(pytest.MonkeyPatch(), Path(tempfile.mkdtemp()))
    config = harness.config(deepseek_v3_debugmodel(), layers=2, steps=1, compile=True, seed=0)
    config.training.mixed_precision_param = "float32"  # as the 0.3.0 audit tests run it
    return harness.build(rocm(config))


def audit_with_routing(trainer: Any, batch: Any, hold: bool) -> None:
    """The audit of ``batch``, with each pass's selected experts recorded per MoE layer."""
    from torchtitan.models.common.moe import TokenChoiceTopKRouter

    import titan_rocm.adapters.tt030.audit as audit030
    import titan_rocm.numerics.audit as audit
    from titan_rocm.numerics.stats import AuditSettings

    routes: dict[str, dict[str, torch.Tensor]] = {}
    current = {"pass": ""}
    for name, module in trainer.model_parts[0].named_modules():
        if isinstance(module, TokenChoiceTopKRouter):
            def hook(m: Any, args: Any, out: Any, name: str = name) -> None:
                routes.setdefault(current["pass"], {})[name] = out[1].detach().sort(-1).values
            module.register_forward_hook(hook)
    passes = iter(("job", "eager", "reference"))
    step_of = audit030.trainer_step

    def named_step(trainer: Any, labels: Any) -> Any:
        inner = step_of(trainer, labels)

        def step(input_dict: Any, labels: Any) -> Any:
            current["pass"] = next(passes)
            return inner(input_dict, labels)
        return step

    audit030.trainer_step = named_step
    if not hold:
        audit.HeldPrecision = _NoHold  # the reference as before issue 24's fix
    input_dict, labels = batch
    r = audit030.audit_030(trainer, input_dict, labels, AuditSettings.of(trainer.config.rocm))
    print(f"audit: {'FLAGGED' if r.flagged else 'ok'}; reference {r.reference_dtype}; "
          f"notes {r.notes}")
    for p in r.parameters:
        if ".moe." in p.name or "ffn_norm" in p.name:
            print(f"  {p.name:55s} err_job {p.err_job:.3g}  err_eager {p.err_eager:.3g}  "
                  f"ratio {p.ratio:.3g}{'  FLAGGED' if p.flagged else ''}")
    for other in ("eager", "reference"):
        for layer, ids in routes["job"].items():
            flipped = int((ids != routes[other][layer]).any(-1).sum())
            print(f"routing, job vs {other}, {layer}: {flipped} of {ids[..., 0].numel()} "
                  "tokens sent to other experts")


class _NoHold(contextlib.nullcontext):
    def notes(self, dtype: Any) -> list[str]:
        return []


def experts_alone(trainer: Any, batch: Any) -> None:
    """Block 1's experts alone on ``batch`` against float64 (see the module docstring)."""
    from torchtitan.models.common.moe import GroupedExperts

    model = trainer.model_parts[0]
    experts = next(m for m in model.modules() if isinstance(m, GroupedExperts))
    seen: dict[str, list[torch.Tensor]] = {}
    experts.register_forward_pre_hook(
        lambda m, args: seen.setdefault("args", [a.detach().clone() for a in args]) and None)
    input_dict, labels = batch
    with torch.compiler.set_stance("force_eager"), torch.no_grad():
        inputs, _, extra = trainer.post_dataloading_process(input_dict, labels)
        model(inputs, **extra)
    x, counts = seen["args"]
    weights = [getattr(experts, k).detach() for k in ("w1_EFD", "w2_EDF", "w3_EFD")]
    weights = [w.full_tensor() if hasattr(w, "full_tensor") else w for w in weights]
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    grad_out = torch.randn(x.shape[0], weights[1].shape[1],
                           generator=torch.Generator().manual_seed(0))

    def as_written(x: Any, w1: Any, w2: Any, w3: Any) -> Any:  # GroupedExperts.forward's math
        h = F.silu(torch._grouped_mm(x.bfloat16(), w1.bfloat16().transpose(-2, -1), offs=offs))
        h = h * torch._grouped_mm(x.bfloat16(), w3.bfloat16().transpose(-2, -1), offs=offs)
        return torch._grouped_mm(h, w2.bfloat16().transpose(-2, -1), offs=offs).type_as(x)

    def per_expert(x: Any, w1: Any, w2: Any, w3: Any) -> Any:  # the same, in x's dtype
        out, start = [], 0
        for e, end in enumerate(offs.tolist()):
            h = F.silu(x[start:end] @ w1[e].T) * (x[start:end] @ w3[e].T)
            out.append(h @ w2[e].T)
            start = end
        return torch.cat(out)

    def run(fn: Any, dtype: torch.dtype) -> list[torch.Tensor]:
        leaves = [t.to(dtype).clone().requires_grad_() for t in (x, *weights)]
        out = fn(*leaves)
        out.backward(grad_out.to(dtype))
        return [out.detach().double()] + [t.grad.double() for t in leaves]

    torch._dynamo.reset()
    rows = {"eager, as written (bfloat16 GEMMs)": run(as_written, torch.float32),
            "compiled, as written": run(torch.compile(as_written, fullgraph=True),
                                        torch.float32),
            "eager, per expert in float32": run(per_expert, torch.float32)}
    with torch._inductor.config.patch(emulate_precision_casts=True):
        torch._dynamo.reset()
        rows["compiled, emulate_precision_casts"] = run(
            torch.compile(as_written, fullgraph=True), torch.float32)
    truth = run(per_expert, torch.float64)

    def rel(a: torch.Tensor, b: torch.Tensor) -> str:
        return f"{float((a - b).norm() / b.norm()):10.2e}"

    print(f"block 1's experts alone: {x.shape[0]} routed tokens, counts {counts.tolist()}")
    print(f"{'against float64':42s}{'out':>10s}{'x':>10s}{'w1':>10s}{'w2':>10s}{'w3':>10s}")
    for name, got in rows.items():
        print(f"{name:42s}" + "".join(rel(a, b) for a, b in zip(got, truth, strict=True)))
    a, b = rows["compiled, as written"], rows["eager, as written (bfloat16 GEMMs)"]
    print(f"{'compiled vs eager, as written':42s}"
          + "".join(rel(p, q) for p, q in zip(a, b, strict=True)))


def main(argv: list[str]) -> int:
    """Build the trainer, audit it, measure the experts alone."""
    torch._inductor.config.compile_threads = 1
    trainer = _trainer()
    try:
        batch = next(iter(trainer.dataloader))  # the audit's micro-batch, both times
        audit_with_routing(trainer, batch, hold="--no-hold" not in argv)
        experts_alone(trainer, batch)
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
