"""The reference pass's arithmetic kept at its own dtype where the model casts down itself.

Re-typing parameters and turning autocast off does not make a pass high-precision when the
model's code casts to a 16-bit dtype on its own: TorchTitan 0.3.0's
``GroupedExperts.forward`` (``torchtitan/models/common/moe.py``) runs its three grouped GEMMs
as ``torch._grouped_mm(x.bfloat16(), w.bfloat16().transpose(-2, -1), offs=...)`` whatever the
parameters' dtype, and 0.2.2's ``_run_experts_grouped_mm`` does the same. Such a reference
is as low-precision as the job there, and under FSDP (float32 reference, nothing re-typed) it
*is* the eager pass: ``err_eager = 0`` and the float32 floor judges a bfloat16 computation
(measured: 0.3.0's deepseek_v3 debug experts, compiled vs eager, 3.5e-3 apart with both
5e-3 from a float64 computation; docs/numerics-audit.md).

:class:`HeldPrecision` (a ``TorchDispatchMode``, active in the reference pass only) keeps
those casts of plain tensors of 32 bits or more in the tensor's own dtype, and computes
``torch._grouped_mm`` of such operands one matmul per group (:func:`grouped_mm_per_group`:
``torch._grouped_mm`` has no float64 on CPU). Tensor subclasses (DTensors, quantised or
wrapper tensors) and float8 casts (quantisation feeding scaled-GEMM kernels) are left as
they are.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HELD = (torch.bfloat16, torch.float16)
"""The down-cast targets held at the source's dtype."""


def _plain_wide(t: Any) -> bool:
    """A plain tensor (or Parameter) of a floating dtype of 32 bits or more."""
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.is_floating_point()
            and t.dtype.itemsize >= 4)


def grouped_mm_per_group(a: torch.Tensor, b: torch.Tensor,
                         offs: torch.Tensor | None) -> torch.Tensor:
    """``torch._grouped_mm(a, b, offs=offs)`` as one ordinary matmul per group, in the
    operands' (wider) dtype, for its four forms (2-D x 3-D: ``a``'s rows grouped, as the experts'
    forward; 2-D x 2-D: the shared dimension grouped, as the weight gradient; 3-D x 2-D:
    ``b``'s columns grouped; 3-D x 3-D: a batched matmul). Rows or columns past the last
    group get zeros. Reads the offsets on the host. (A tool may not import the grouped-MM
    workaround's ``loop_gemm``, which is the first form alone: docs/architecture.md.)"""
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
    """Down-casts to bfloat16/float16 of wide plain tensors are held (a copy in the tensor's
    own dtype), and ``torch._grouped_mm`` of wide plain operands is computed per group;
    ``casts`` counts what was held, by target dtype, ``grouped`` the grouped GEMMs.

    A dispatch mode, not a function mode: it sits below autograd, so the cast's and the
    GEMM's backward see it too, and activation checkpointing's recompute (which runs under
    the engine, where a function mode is not active) sees the same operations as the
    forward did."""

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
