"""The reference pass's arithmetic kept at its own dtype where the model casts down itself.

TorchTitan's grouped experts cast to bfloat16 whatever the parameters' dtype (0.3.0
``GroupedExperts.forward`` in ``torchtitan/models/common/moe.py``; 0.2.2
``_run_experts_grouped_mm``), so re-typing parameters alone leaves the reference as
low-precision as the job (docs/numerics-audit.md). Float8 casts (quantisation) are left alone."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HELD = (torch.bfloat16, torch.float16)


def _plain_wide(t: Any) -> bool:
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.is_floating_point()
            and t.dtype.itemsize >= 4)


def grouped_mm_per_group(a: torch.Tensor, b: torch.Tensor,
                         offs: torch.Tensor | None) -> torch.Tensor:
    """``torch._grouped_mm`` as one matmul per group in the operands' dtype (it has no float64 on
    CPU). Not the grouped-MM workaround's ``loop_gemm``: a tool may not import it."""
    wide = torch.promote_types(a.dtype, b.dtype)  # held operands of two widths: the wider
    a, b = a.to(wide), b.to(wide)
    if offs is None:
        return torch.bmm(a, b)
    ends = [int(e) for e in offs.tolist()]
    spans = list(zip([0, *ends[:-1]], ends, strict=True))
    if a.dim() == 2 and b.dim() == 2:  # out[g] = a[:, k of g] @ b[k of g]
        return torch.stack([a[:, s:e] @ b[s:e] for s, e in spans])
    if a.dim() == 2:  # out[m of g] = a[m of g] @ b[g]
        pieces = [a[s:e] @ b[g] for g, (s, e) in enumerate(spans)]
        pieces.append(a.new_zeros((a.shape[0] - ends[-1], b.shape[-1])))
        return torch.cat(pieces, dim=0)
    pieces = [a[g] @ b[:, s:e] for g, (s, e) in enumerate(spans)]  # out[:, n of g]
    pieces.append(a.new_zeros((a.shape[1], b.shape[1] - ends[-1])))
    return torch.cat(pieces, dim=1)


class HeldPrecision(TorchDispatchMode):
    """Down-casts to 16 bits of wide plain tensors are held, and ``torch._grouped_mm`` of wide
    operands runs per group.

    A dispatch mode, not a function mode: the backward and checkpointing's recompute run in the
    autograd engine, where a function mode is inactive."""

    def __init__(self) -> None:
        super().__init__()
        self.casts: Counter[str] = Counter()
        self.grouped = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.ops.aten._to_copy.default:
            target = kwargs.get("dtype")
            if target in HELD and args and _plain_wide(args[0]):
                self.casts[str(target).removeprefix("torch.")] += 1
                kwargs["dtype"] = args[0].dtype
        elif func is torch.ops.aten._grouped_mm.default:
            a, b = args[0], args[1]
            offs = args[2] if len(args) > 2 else kwargs.get("offs")
            bias = args[3] if len(args) > 3 else kwargs.get("bias")
            if _plain_wide(a) and _plain_wide(b) and bias is None:
                self.grouped += 1
                return grouped_mm_per_group(a, b, offs)
        return func(*args, **kwargs)

    def notes(self, dtype: torch.dtype) -> list[str]:
        """One sentence of what was held (the result's ``notes``), or none."""
        if not self.casts and not self.grouped:
            return []
        name = str(dtype).removeprefix("torch.")
        casts = ", ".join(f"{n} to {t}" for t, n in sorted(self.casts.items()))
        return [f"reference pass: the model's own down-casts held at {name} ({casts or 'none'})"
                f" and {self.grouped} grouped GEMM(s) computed per group in {name}: its "
                "low-precision parts are judged against a high-precision answer"]
