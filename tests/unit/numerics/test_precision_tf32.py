"""``precision.tf32`` gives back the TF32 state as it found it, not only its value."""

from __future__ import annotations

import pytest
import torch

from titan_rocm.numerics.precision import tf32


@pytest.mark.parametrize("enabled", [False, True])
def test_tf32_puts_back_what_it_found(enabled: bool) -> None:
    """On torch >= 2.9 a legacy write of ``allow_tf32`` moves ``fp32_precision`` from "none"
    to "ieee"/"tf32": the context writes only flags that differ and puts them back, so where
    nothing differs (every CPU audit) the state is untouched. Where it differs, the value is
    put back through the legacy flag, which leaves "ieee" for "none" (the same arithmetic;
    the new API would make TorchTitan's and Inductor's legacy reads raise)."""
    flags = (torch.backends.cuda.matmul, torch.backends.cudnn)
    before = [f.allow_tf32 for f in flags]
    states = [getattr(f, "fp32_precision", None) for f in flags]
    with tf32(enabled):
        assert [f.allow_tf32 for f in flags] == [enabled, enabled]
    assert [f.allow_tf32 for f in flags] == before
    if not enabled:
        assert [getattr(f, "fp32_precision", None) for f in flags] == states
