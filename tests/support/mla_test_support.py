"""Fixtures and references for the MLA tests: the fake aiter in both generations, simulated
ROCm facts, reference attention.

tests/conftest.py makes the fixtures available; an MLA test module marks itself
``pytestmark = pytest.mark.usefixtures("clean_mla_state")``. ``fake_aiter_path`` is parametrized
over the ``--aiter`` choices, each served by one fake: ``tests/fake_aiter/pypi_0_1_7`` (API
generation 0.1.7), ``tests/fake_aiter/e4048607`` (main at e4048607) and ``tests/fake_aiter/main``
(the newest main read, with ROCm/aiter#4875's FlyDSL varlen backward), so every test that takes
it runs against all three, through their ``torch.ops.aiter`` schemas as with the real aiter.
A test tells them apart by ``fake.CHOICE`` (``fake.GENERATION`` is ``main`` for both mains).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from titan_rocm import log as titan_log
from titan_rocm import patches, platform
from titan_rocm.platform import PlatformFacts
from titan_rocm.workarounds.mla_ck_backward import guard, route_log

FAKE_AITER = Path(__file__).resolve().parents[1] / "fake_aiter"
GENERATIONS = {"0.1.7": "pypi_0_1_7", "e4048607": "e4048607", "main": "main"}
"""``--aiter`` choice (``titan_rocm.platform.SIMULATED_AITERS``) -> the fake under
tests/fake_aiter that stands for it."""


def drop_aiter_modules() -> None:
    """Forget every imported aiter module and the fake's ``torch.ops.aiter`` ops."""
    support = sys.modules.get("fake_aiter_support")
    if support is not None:
        support.destroy()
    for name in [m for m in sys.modules if m == "aiter" or m.startswith("aiter.")]:
        del sys.modules[name]


@pytest.fixture
def clean_mla_state(monkeypatch) -> Iterator[None]:
    """Each test starts and ends without aiter loaded, guard hooks, logged routes or SAC ops
    (0.2.2: in DeepSeek's ``_op_sac_save_list``; 0.3.0: in ``_get_default_save_ops``)."""
    monkeypatch.delenv("GPU_ARCHS", raising=False)
    drop_aiter_modules()
    yield
    guard.uninstall()
    drop_aiter_modules()
    route_log.forget()
    titan_log.forget("mla_")
    patches.restore(by="mla_ck_backward")


@pytest.fixture(params=list(GENERATIONS))
def fake_aiter_path(request, monkeypatch) -> str:
    """One fake aiter importable (nothing imported yet); its ``--aiter`` choice."""
    monkeypatch.syspath_prepend(str(FAKE_AITER))
    monkeypatch.syspath_prepend(str(FAKE_AITER / GENERATIONS[request.param]))
    importlib.invalidate_caches()
    return request.param


@pytest.fixture
def fake_aiter(fake_aiter_path) -> Any:
    """The fake aiter imported; its control module (device gfx942, no calls yet)."""
    fake = importlib.import_module("aiter._fake")
    importlib.import_module("aiter.ops.mha")
    fake.reset("gfx942")
    return fake


@contextlib.contextmanager
def on_rocm(arch: str, fake: Any = None, aiter: str | None = None) -> Iterator[PlatformFacts]:
    """Simulated ROCm facts for ``arch`` with the aiter the fake stands for (its ``get_gfx()``
    predicted from ``GPU_ARCHS`` as the fake answers it); the fake's device set to ``arch``."""
    if fake is not None:
        fake.reset(arch)
    choice = aiter or (fake.CHOICE if fake is not None else "main")
    with platform.override(PlatformFacts.simulated_rocm(arch, aiter=choice)) as facts:
        yield facts


def varlen_backward_kernel(fake: Any, arch: str = "gfx942") -> str:
    """The kernel a bf16 causal q/k 192, v 128 varlen backward reaches through titan-rocm with
    ``fake`` on a device of ``arch`` (``get_gfx()`` answering it): ROCm/aiter#4875's FlyDSL
    kernel with the newest main on gfx942, CK ``mha_varlen_bwd`` everywhere else."""
    if (fake.CHOICE, arch) == ("main", "gfx942"):
        return "flydsl_flash_attn_varlen_bwd"
    return "mha_varlen_bwd"


def cpu_facts(**changes: Any) -> PlatformFacts:
    """A CPU-only torch build's facts."""
    facts = PlatformFacts("2.13", None, None, 0, None, None, None, "3.9.0", False)
    return dataclasses.replace(facts, **changes)


def qkv(batch=2, seqlen=32, heads=4, qk=192, v=128, dtype=torch.bfloat16, seed=0):
    """bshd q, k, v (aiter's layout) as leaf tensors needing grad."""
    gen = torch.Generator().manual_seed(seed)
    shapes = ((batch, seqlen, heads, qk), (batch, seqlen, heads, qk), (batch, seqlen, heads, v))
    return [torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in shapes]


def reference(q, k, v, scale, dout, attn_mask=None):
    """fp32 SDPA of bshd inputs, causal or under ``attn_mask``: (out, dq, dk, dv)."""
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(
        qf.transpose(1, 2), kf.transpose(1, 2), vf.transpose(1, 2), scale=scale,
        is_causal=attn_mask is None, attn_mask=attn_mask,
    ).transpose(1, 2)
    out.backward(dout.float())
    return out.detach(), qf.grad, kf.grad, vf.grad


def assert_matches(got, want, tol=2e-2):
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def assert_compiled_matches_eager(module, compiled, qkv, **kwargs) -> None:
    """``module`` and ``compiled`` (its ``torch.compile``) on copies of ``qkv``, forward and a
    backward of ones: the outputs and every gradient equal."""
    results = []
    for fn in (module, compiled):
        q, k, v = (t.detach().clone().requires_grad_() for t in qkv)
        out = fn(q, k, v, **kwargs)
        out.backward(torch.ones_like(out))
        results.append((out.detach(), q.grad, k.grad, v.grad))
    for eager, comp in zip(*results, strict=True):
        torch.testing.assert_close(comp, eager)


def assert_grads_close(ours: dict, stock: dict, rel: float = 5e-2) -> None:
    """The same parameters' gradients, each within ``rel`` of the stock one (norm of the
    difference over the norm)."""
    assert set(ours) == set(stock)
    for name, grad in stock.items():
        diff = (ours[name].float() - grad.float()).norm() / grad.float().norm()
        assert diff < rel, (name, float(diff))
