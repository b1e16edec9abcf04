"""A stand-in for the weights TorchTitan's float8 grouped-MM converter makes (tests only: torchao
is not installed here, and both TorchTitans refuse that converter without a CUDA SM89+ or
gfx942+ device).

The converter (0.2.2 ``quantize.grouped_mm.float8``, ``Float8GroupedMMConverter.convert``;
0.3.0 ``Float8GroupedExperts``) swaps each experts weight for torchao's
``ScaledGroupedMMTensor`` (pytorch/ao ``torchao/prototype/moe_training/tensor.py`` at
01bfca99). What this copies of it, in its own code: a wrapper subclass without storage of its
own that holds the weight as its one inner tensor ``_data`` (``__tensor_flatten__`` names it);
``__torch_function__`` sends ``torch._grouped_mm`` with it as ``B`` to torchao's scaled grouped
GEMM (here: recorded in :data:`SCALED_CALLS`, computed in BF16) and runs everything else with
torch-function subclassing off; ``__torch_dispatch__`` unwraps, runs the op, and wraps the
result again only for the ops torchao lists (``_to_copy``, ``transpose``, ``view``, ...).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree

SCALED_CALLS: list[tuple[int, ...]] = []
"""Shapes of ``B`` for every ``torch._grouped_mm`` the stand-in's 'scaled' path took."""

_aten = torch.ops.aten
PRESERVED = {
    _aten.empty_like.default, _aten.new_zeros.default, _aten.slice.Tensor, _aten.copy_.default,
    _aten.view.default, _aten.as_strided.default, _aten._to_copy.default,
    _aten._pin_memory.default, _aten.split.Tensor, _aten.clone.default, _aten.transpose.int,
}
"""The ops whose results torchao wraps again (its ``_ops_to_preserve_subclass``)."""


class ScaledGroupedMMTensor(torch.Tensor):
    """The stand-in (see the module docstring)."""

    @staticmethod
    def __new__(cls, data: torch.Tensor) -> ScaledGroupedMMTensor:
        return torch.Tensor._make_wrapper_subclass(
            cls, data.size(), strides=data.stride(), storage_offset=data.storage_offset(),
            dtype=data.dtype, layout=data.layout, device=data.device,
            requires_grad=data.requires_grad)

    def __init__(self, data: torch.Tensor) -> None:
        self._data = data

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.__name__ == "_grouped_mm" and isinstance(args[1], cls) and kwargs.get("offs") \
                is not None:
            SCALED_CALLS.append(tuple(args[1].shape))
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func == _aten.detach.default:
            return cls(args[0]._data.detach())
        plain_args, plain_kwargs = pytree.tree_map_only(
            cls, lambda t: t._data, (args, kwargs or {}))
        out = func(*plain_args, **plain_kwargs)
        if func not in PRESERVED:
            return out
        return pytree.tree_map(
            lambda x: cls(x) if isinstance(x, torch.Tensor) and type(x) is torch.Tensor else x,
            out)

    def __tensor_flatten__(self) -> tuple[list[str], dict[str, Any]]:
        return ["_data"], {}

    @staticmethod
    def __tensor_unflatten__(inner, spec, outer_size, outer_stride):
        return ScaledGroupedMMTensor(inner["_data"])


def quantize_experts(module: nn.Module, names: tuple[str, ...]) -> None:
    """Swap ``module``'s weights ``names`` for wrapped parameters, as torchao's ``quantize_``
    with ``MoETrainingConfig`` does for TorchTitan's converter."""
    for name in names:
        weight = getattr(module, name)
        setattr(module, name, nn.Parameter(ScaledGroupedMMTensor(weight.data),
                                           requires_grad=weight.requires_grad))
