"""Platform facts: which torch build, which GPU architecture, which Triton, is aiter there.

Everything in titan-rocm that depends on the machine asks :func:`current`. The answer
is detected once and cached; tests and ``titan-rocm plan --arch`` replace it with
:func:`override` (a context manager) instead of patching torch.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, replace
from importlib import metadata

from titan_rocm.archs import ArchFacts, arch_facts, normalize_arch


@dataclass(frozen=True)
class PlatformFacts:
    """What titan-rocm knows about the machine it runs on."""

    torch_version: str | None
    hip_version: str | None
    """``torch.version.hip``; None on CUDA and CPU builds."""
    cuda_version: str | None
    device_count: int
    gcn_arch_name: str | None
    """``gcnArchName`` of device 0 (e.g. ``gfx942:sramecc+:xnack-``); None off ROCm."""
    device_capability: tuple[int, int] | None
    device_name: str | None
    triton_version: str | None
    aiter_spec_found: bool
    """An ``aiter`` package is installed. Importing it is still left to the caller:
    aiter raises RuntimeError/AssertionError at import without ROCm."""
    simulated: bool = False
    """True when these facts were made up (``plan --arch``, tests), not detected."""

    @property
    def is_rocm(self) -> bool:
        """The torch build is a ROCm (HIP) build."""
        return self.hip_version is not None

    @property
    def gfx_arch(self) -> str | None:
        """Bare target of device 0, e.g. ``gfx942``; None off ROCm or without a device."""
        return normalize_arch(self.gcn_arch_name) if self.gcn_arch_name else None

    @property
    def arch(self) -> ArchFacts | None:
        """Per-architecture facts for device 0, or None when unknown or not ROCm."""
        if self.gfx_arch is None:
            return None
        try:
            return arch_facts(self.gfx_arch)
        except ValueError:
            return None

    @property
    def aiter_usable(self) -> bool:
        """aiter can be expected to import: installed, on a ROCm build with a device."""
        return self.aiter_spec_found and self.is_rocm and self.device_count > 0

    def describe(self) -> str:
        """One line for logs and ``titan-rocm plan``."""
        if self.is_rocm:
            where = f"ROCm {self.hip_version}, {self.gcn_arch_name or 'no device'}"
        elif self.cuda_version:
            where = f"CUDA {self.cuda_version}, capability {self.device_capability}"
        else:
            where = "CPU-only torch build"
        sim = " (simulated)" if self.simulated else ""
        return (
            f"torch {self.torch_version}, {where}, triton {self.triton_version or 'absent'}, "
            f"aiter {'installed' if self.aiter_spec_found else 'absent'}{sim}"
        )

    @classmethod
    def simulated_rocm(cls, arch: str, base: PlatformFacts | None = None) -> PlatformFacts:
        """Facts of a pretend ROCm machine with one ``arch`` device and aiter installed.

        Used by ``titan-rocm plan --arch`` on a login node and by tests.

        Raises:
            ValueError: ``arch`` is not an architecture titan-rocm knows.
        """
        facts = arch_facts(arch)
        base = base or detect()
        return replace(
            base,
            hip_version=base.hip_version or "simulated",
            device_count=max(base.device_count, 1),
            gcn_arch_name=facts.name,
            device_capability=None,
            device_name=facts.products[0],
            aiter_spec_found=True,
            simulated=True,
        )


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _triton_version() -> str | None:
    # ROCm users have pytorch-triton-rocm, which installs the module ``triton``.
    for dist in ("triton", "pytorch-triton-rocm", "pytorch-triton"):
        version = _dist_version(dist)
        if version:
            return version
    return None


def detect() -> PlatformFacts:
    """Detect the facts of this process's machine (uncached; prefer :func:`current`)."""
    try:
        import torch
    except ImportError:
        return PlatformFacts(
            torch_version=None,
            hip_version=None,
            cuda_version=None,
            device_count=0,
            gcn_arch_name=None,
            device_capability=None,
            device_name=None,
            triton_version=_triton_version(),
            aiter_spec_found=importlib.util.find_spec("aiter") is not None,
        )
    hip = getattr(torch.version, "hip", None)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gcn = capability = name = None
    if count:
        props = torch.cuda.get_device_properties(0)
        gcn = getattr(props, "gcnArchName", None) if hip else None
        capability = (props.major, props.minor)
        name = props.name
    return PlatformFacts(
        torch_version=torch.__version__,
        hip_version=hip,
        cuda_version=getattr(torch.version, "cuda", None),
        device_count=count,
        gcn_arch_name=gcn,
        device_capability=capability,
        device_name=name,
        triton_version=_triton_version(),
        aiter_spec_found=importlib.util.find_spec("aiter") is not None,
    )


_current: PlatformFacts | None = None
_overrides: list[PlatformFacts] = []


def current() -> PlatformFacts:
    """The facts in force: the innermost :func:`override`, else detected once and cached."""
    global _current
    if _overrides:
        return _overrides[-1]
    if _current is None:
        _current = detect()
    return _current


@contextlib.contextmanager
def override(facts: PlatformFacts) -> Iterator[PlatformFacts]:
    """Make :func:`current` return ``facts`` inside the ``with`` block."""
    _overrides.append(facts)
    try:
        yield facts
    finally:
        _overrides.remove(facts)
