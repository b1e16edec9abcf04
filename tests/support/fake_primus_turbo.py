"""A fake Primus-Turbo (tests only): the module paths, signatures and config classes titan-rocm
touches, in the generations that differ for it, with fp32 reference math.

Copied from AMD-AGI/Primus-Turbo (read, not pasted):

- ``main``: commit a6a16cdc (2026-08-21, after tag v0.4.0).
  ``primus_turbo/pytorch/ops/grouped_gemm.py`` ``grouped_gemm(a, b, group_lens,
  group_offs=None, trans_b=False, num_cu=None, schedule="static",
  fuse_bgrad_accum_pattern=None)``; ``primus_turbo/pytorch/ops/grouped_gemm_fp8.py`` line 853
  ``grouped_gemm_fp8(a, b, group_lens, group_offs=None, trans_b=True, out_dtype=None,
  config=None, num_cu=None, fuse_bgrad_accum_pattern=None)``, decorated with
  ``torch._dynamo.disable`` (a ``functools.wraps`` wrapper: the signature stays readable);
  ``Float8QuantConfig``/``Format``/``ScalingGranularity`` in
  ``primus_turbo/pytorch/core/low_precision.py`` (from v0.2.0, 19ee6a5a).
- ``v0.1.0``: tag v0.1.0 (8f8fea65): ``grouped_gemm(a, b, group_lens, group_offs=None,
  trans_b=False, num_cu=None)``, ``grouped_gemm_fp8(a, b, group_lens, group_offs=None,
  trans_b=True, config=None, num_cu=None)``, the config classes in
  ``primus_turbo/pytorch/core/float8.py``.
- ``bf16_only``: ``main`` without ``grouped_gemm_fp8`` (a build before it was added,
  fc9b7f01 of 2025-06-27): what feature detection must refuse.

The math: ``a @ b[g]^T`` per group (``trans_b=True``) in fp32; the FP8 form first rounds ``a``
and ``b`` through float8 E4M3 with one dynamic scale per tensor (``amax / 448``), the
TENSORWISE recipe, with the rounding's gradient passed straight through. Every call is
recorded in :data:`CALLS` as ``(name, details)``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib.machinery
import sys
import types
from typing import Any

import pytest
import torch

GENERATIONS = ("main", "v0.1.0", "bf16_only")
CALLS: list[tuple[str, dict[str, Any]]] = []
E4M3_MAX = 448.0


class Format(enum.Enum):
    E4M3 = enum.auto()
    E5M2 = enum.auto()


class ScalingGranularity(enum.Enum):
    TENSORWISE = enum.auto()
    ROWWISE = enum.auto()


class ScalingStrategy(enum.Enum):
    DYNAMIC = enum.auto()


@dataclasses.dataclass
class Float8QuantConfig:
    format: Format = Format.E4M3
    granularity: ScalingGranularity = ScalingGranularity.TENSORWISE
    strategy: ScalingStrategy = ScalingStrategy.DYNAMIC
    block_size: int | None = None


def _check_groups(a: torch.Tensor, b: torch.Tensor, group_lens: torch.Tensor) -> None:
    # Primus-Turbo's contract: int64 group sizes covering every row of a, one b per group.
    assert type(a) is torch.Tensor and type(b) is torch.Tensor, "kernels take plain tensors"
    assert group_lens.dtype == torch.int64, group_lens.dtype
    assert int(group_lens.sum()) == a.shape[0], "the groups must cover every row of a"
    assert b.shape[0] == group_lens.shape[0]


def _per_group(a: torch.Tensor, b: torch.Tensor, group_lens: torch.Tensor,
               trans_b: bool) -> torch.Tensor:
    pieces, start = [], 0
    for g, rows in enumerate(group_lens.tolist()):
        w = b[g].float()
        pieces.append(a[start:start + rows].float() @ (w.transpose(0, 1) if trans_b else w))
        start += rows
    return torch.cat(pieces)


def _e4m3_tensorwise(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded through E4M3 with one dynamic scale; the gradient passes straight."""
    scale = t.detach().abs().amax().float().clamp(min=1e-12) / E4M3_MAX
    rounded = (t.detach().float() / scale).to(torch.float8_e4m3fn).float() * scale
    return t.float() + (rounded - t.float()).detach()


def _dynamo_disable(fn):
    """Like ``torch._dynamo.disable(recursive=True, reason=...)``: a ``functools.wraps``
    wrapper, so ``inspect.signature`` reads the wrapped parameters."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def grouped_gemm_main(a: torch.Tensor, b: torch.Tensor, group_lens: torch.Tensor,
                      group_offs: torch.Tensor | None = None, trans_b: bool = False,
                      num_cu: int | None = None, schedule: str = "static",
                      fuse_bgrad_accum_pattern: str | None = None) -> torch.Tensor:
    _check_groups(a, b, group_lens)
    CALLS.append(("grouped_gemm", {"group_lens": group_lens.tolist(), "trans_b": trans_b}))
    return _per_group(a, b, group_lens, trans_b).to(a.dtype)


def grouped_gemm_v010(a: torch.Tensor, b: torch.Tensor, group_lens: torch.Tensor,
                      group_offs: torch.Tensor | None = None, trans_b: bool = False,
                      num_cu: int | None = None) -> torch.Tensor:
    return grouped_gemm_main(a, b, group_lens, group_offs, trans_b, num_cu)


def _fp8(a: torch.Tensor, b: torch.Tensor, group_lens: torch.Tensor, trans_b: bool,
         out_dtype: torch.dtype | None, config: Any) -> torch.Tensor:
    _check_groups(a, b, group_lens)
    config = config if config is not None else Float8QuantConfig()
    assert config.granularity.name == "TENSORWISE", "the fake models TENSORWISE only"
    CALLS.append(("grouped_gemm_fp8", {"group_lens": group_lens.tolist(), "trans_b": trans_b,
                                       "format": config.format.name,
                                       "granularity": config.granularity.name}))
    out = _per_group(_e4m3_tensorwise(a), _e4m3_tensorwise(b), group_lens, trans_b)
    return out.to(out_dtype or torch.promote_types(a.dtype, b.dtype))


@_dynamo_disable
def grouped_gemm_fp8_main(a: torch.Tensor, b: torch.Tensor, group_lens: torch.Tensor,
                          group_offs: torch.Tensor | None = None, trans_b: bool = True,
                          out_dtype: torch.dtype | None = None, config: Any = None,
                          num_cu: int | None = None,
                          fuse_bgrad_accum_pattern: str | None = None) -> torch.Tensor:
    return _fp8(a, b, group_lens, trans_b, out_dtype, config)


def grouped_gemm_fp8_v010(a: torch.Tensor, b: torch.Tensor, group_lens: torch.Tensor,
                          group_offs: torch.Tensor | None = None, trans_b: bool = True,
                          config: Any = None, num_cu: int | None = None) -> torch.Tensor:
    return _fp8(a, b, group_lens, trans_b, None, config)


def _module(name: str, package: bool = False, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        module.__path__ = []
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def install(monkeypatch: pytest.MonkeyPatch, generation: str = "main") -> None:
    """Put one generation of the fake on ``sys.modules`` (undone with ``monkeypatch``)."""
    if generation not in GENERATIONS:
        raise ValueError(f"generation {generation!r}; accepted: {', '.join(GENERATIONS)}")
    CALLS.clear()
    ops: dict[str, Any] = {"grouped_gemm": grouped_gemm_main}
    config_module = "low_precision"
    if generation == "main":
        ops["grouped_gemm_fp8"] = grouped_gemm_fp8_main
    elif generation == "v0.1.0":
        ops = {"grouped_gemm": grouped_gemm_v010, "grouped_gemm_fp8": grouped_gemm_fp8_v010}
        config_module = "float8"
    classes = {"Float8QuantConfig": Float8QuantConfig, "Format": Format,
               "ScalingGranularity": ScalingGranularity, "ScalingStrategy": ScalingStrategy}
    modules = {
        "primus_turbo": _module("primus_turbo", package=True),
        "primus_turbo.pytorch": _module("primus_turbo.pytorch", package=True),
        "primus_turbo.pytorch.ops": _module("primus_turbo.pytorch.ops", **ops),
        "primus_turbo.pytorch.core": _module("primus_turbo.pytorch.core", package=True),
        f"primus_turbo.pytorch.core.{config_module}": _module(
            f"primus_turbo.pytorch.core.{config_module}", **classes),
    }
    modules["primus_turbo"].pytorch = modules["primus_turbo.pytorch"]
    modules["primus_turbo.pytorch"].ops = modules["primus_turbo.pytorch.ops"]
    modules["primus_turbo.pytorch"].core = modules["primus_turbo.pytorch.core"]
    for name in [n for n in sys.modules if n == "primus_turbo" or n.startswith("primus_turbo.")]:
        monkeypatch.delitem(sys.modules, name)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)


def names() -> list[str]:
    """The fake's functions called since :func:`install`, in order."""
    return [name for name, _ in CALLS]
