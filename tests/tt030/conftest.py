"""The TorchTitan 0.3.0 suite: CPU device type before TorchTitan loads, and the harness fixture.

TorchTitan 0.3.0 picks its device type once, when ``torchtitan.tools.utils`` is first
imported (``torch._utils._get_available_device_type() or "cuda"``): on a CPU machine that is
"cuda". So this conftest, which pytest imports before any test module of this folder, makes
the probe answer "cpu" first. Only when 0.3.x is installed: the 0.2.2 suite never sees it
(tests/conftest.py does not even import this folder's test modules there).
"""

from __future__ import annotations

import pytest

from titan_rocm import torchtitan_version

if torchtitan_version.series() == "0.3":
    from tt030_harness import force_cpu_device_type

    force_cpu_device_type()


@pytest.fixture
def cpu_harness(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """CPU stand-ins for TorchTitan 0.3.0's CUDA-only pieces, undone after the test."""
    from tt030_harness import Harness

    return Harness.install(monkeypatch, tmp_path)
