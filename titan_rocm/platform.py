"""Platform facts: torch build, GPU architecture, Triton, aiter.

Tests and ``plan --arch`` replace :func:`current` with :func:`override` instead of patching
torch. aiter is probed without importing it because its ``get_gfx()`` answers the last
``GPU_ARCHS`` entry, not the device (aiter ``aiter/jit/utils/chip_info.py``, 0.1.7.post2 and
main e4048607; docs/mla-ck-backward.md)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Any

from titan_rocm.archs import ArchFacts, arch_facts, normalize_arch

AITER_DISTRIBUTIONS: tuple[str, ...] = ("amd-aiter", "aiter")


@dataclass(frozen=True)
class SimulatedAiter:
    """One aiter ``--aiter`` can simulate (gemm-tables rules are keyed by the same names)."""

    version: str
    label: str
    read_at: str


SIMULATED_AITERS: dict[str, SimulatedAiter] = {
    "0.1.7": SimulatedAiter(
        "0.1.7.post2.dev18", "PyPI's wheel, the default of plan",
        "PyPI amd-aiter 0.1.7.post2.dev18 (ROCm/aiter tag v0.1.7.post2, 169acef)"),
    "e4048607": SimulatedAiter(
        "main e4048607", "aiter main at e4048607 (2026-08-22)",
        "ROCm/aiter main at e4048607 (2026-08-22)"),
    "main": SimulatedAiter(
        "main", "the newest aiter main read (2026-12-01)",
        "ROCm/aiter main as read on 2026-12-01: e4048607 and the merged #4875, #4916 and "
        "#4961 (#4715 open)"),
}
AITER_CHOICES: tuple[str, ...] = (*SIMULATED_AITERS, "absent")
DEFAULT_SIMULATED_AITER = "0.1.7"
"""``pip install amd-aiter`` installs 0.1.7.post2.dev18 (the newest wheel on PyPI)."""


def aiter_choices_help() -> str:
    """The ``--aiter`` choices with what each simulates, for both commands' ``--help``."""
    named = [f"{name}: {aiter.label}" for name, aiter in SIMULATED_AITERS.items()]
    return "; ".join([*named, "absent: no aiter"])
API_GENERATIONS: tuple[str, ...] = ("0.1.7", "main")
"""``0.1.7`` (``_flash_attn_forward`` without ``sink_size`` and fp8 descales) and ``main``."""

_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(version: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)``; ``main`` sorts after every release; None if not a version."""
    if version.strip().lower().startswith("main"):
        return (10**6, 0, 0)
    match = _VERSION.match(version)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def api_generation(version: str | None) -> str | None:
    """The aiter API generation of ``version``; None if unknown."""
    parsed = parse_version(version) if version else None
    if parsed is None:
        return None
    return "0.1.7" if parsed < (0, 1, 8) else "main"


@dataclass(frozen=True)
class AiterFacts:
    """The installed aiter: its version, and the arch its ``get_gfx()`` answers."""

    version: str | None
    gfx: str | None
    gfx_source: str

    @property
    def generation(self) -> str | None:
        """The API generation (``0.1.7`` or ``main``); None when the version is unknown."""
        return api_generation(self.version)

    def mismatch(self, device_arch: str | None) -> bool:
        """aiter's ``get_gfx()`` names another arch than the device's."""
        return device_arch is not None and self.gfx is not None and self.gfx != device_arch

    def describe(self) -> str:
        generation = self.generation or "unknown"
        return (
            f"aiter {self.version or 'version unknown'} (API {generation}), "
            f"get_gfx() {self.gfx or 'unknown'} ({self.gfx_source})"
        )


def predicted_aiter_gfx(
    device_arch: str | None, env: Mapping[str, str] | None = None
) -> tuple[str | None, str]:
    """Predicted before aiter imports, with the reason."""
    env = os.environ if env is None else env
    value = env.get("GPU_ARCHS", "native")
    if value == "native":
        return device_arch, "GPU_ARCHS unset: aiter asks rocminfo"
    last = value.split(";")[-1].strip()
    return (normalize_arch(last) if last else None), f"last entry of GPU_ARCHS={value!r}"


def _installed_aiter_version() -> str | None:
    for dist in AITER_DISTRIBUTIONS:
        version = _dist_version(dist)
        if version:
            return version
    # Not installed as a distribution (a source tree on sys.path): an imported aiter still
    # knows its version (aiter/_version.py).
    version = getattr(sys.modules.get("aiter"), "__version__", None)
    return str(version) if version else None


def probe_aiter(
    device_arch: str | None, env: Mapping[str, str] | None = None
) -> AiterFacts | None:
    """The installed aiter's facts without importing it; None if aiter is not installed."""
    if importlib.util.find_spec("aiter") is None:
        return None
    gfx, source = predicted_aiter_gfx(device_arch, env)
    chip_info = sys.modules.get("aiter.jit.utils.chip_info")
    get_gfx = getattr(chip_info, "get_gfx", None)
    if get_gfx is not None:
        try:
            gfx, source = normalize_arch(str(get_gfx())), "aiter's get_gfx()"
        except Exception:  # aiter's rocminfo probe can fail; the prediction stands
            pass
    return AiterFacts(_installed_aiter_version(), gfx, source)


def simulated_aiter(
    choice: str, device_arch: str, env: Mapping[str, str] | None = None
) -> AiterFacts | None:
    """A pretend aiter for ``plan --aiter`` (None for ``absent``; ValueError for an unknown one)."""
    if choice not in AITER_CHOICES:
        raise ValueError(
            f"aiter = {choice!r} is not valid; accepted: {', '.join(AITER_CHOICES)}"
        )
    if choice == "absent":
        return None
    gfx, source = predicted_aiter_gfx(device_arch, env)
    return AiterFacts(SIMULATED_AITERS[choice].version, gfx, f"simulated; {source}")


@dataclass(frozen=True)
class PlatformFacts:
    """What titan-rocm knows about the machine it runs on."""

    torch_version: str | None
    hip_version: str | None
    cuda_version: str | None
    device_count: int
    gcn_arch_name: str | None
    device_capability: tuple[int, int] | None
    device_name: str | None
    triton_version: str | None
    aiter_spec_found: bool
    """Importing is the caller's call: aiter raises at import without ROCm."""
    simulated: bool = False
    aiter: AiterFacts | None = None
    primus_turbo: bool | None = None
    """None on a real machine (asked by importing it when needed); set on a simulated one."""

    @property
    def is_rocm(self) -> bool:
        """The torch build is a ROCm (HIP) build."""
        return self.hip_version is not None

    @property
    def gfx_arch(self) -> str | None:
        """Bare target of device 0 (``gfx942``); None off ROCm or without a device."""
        return normalize_arch(self.gcn_arch_name) if self.gcn_arch_name else None

    @property
    def arch(self) -> ArchFacts | None:
        if self.gfx_arch is None:
            return None
        try:
            return arch_facts(self.gfx_arch)
        except ValueError:
            return None

    @property
    def aiter_usable(self) -> bool:
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
        if self.aiter is not None:
            aiter = self.aiter.describe()
        else:
            aiter = f"aiter {'installed' if self.aiter_spec_found else 'absent'}"
        return (
            f"torch {self.torch_version}, {where}, triton {self.triton_version or 'absent'}, "
            f"{aiter}{sim}"
        )

    @classmethod
    def simulated_rocm(
        cls,
        arch: str,
        base: PlatformFacts | None = None,
        *,
        aiter: str = DEFAULT_SIMULATED_AITER,
        primus_turbo: bool | None = None,
    ) -> PlatformFacts:
        """A pretend ROCm machine with one ``arch`` device (``plan --arch``, tests); ValueError
        if unknown."""
        facts = arch_facts(arch)
        pretend_aiter = simulated_aiter(aiter, facts.name)
        base = base or detect()
        return replace(
            base,
            hip_version=base.hip_version or "simulated",
            device_count=max(base.device_count, 1),
            gcn_arch_name=facts.name,
            device_capability=None,
            device_name=facts.products[0],
            aiter_spec_found=pretend_aiter is not None,
            aiter=pretend_aiter,
            primus_turbo=primus_turbo,
            simulated=True,
        )


def planned_facts(arch: str | None, aiter: str | None = None,
                  primus_turbo: str | None = None) -> PlatformFacts:
    """This machine, or a simulated ROCm ``arch`` (ValueError for an unknown value)."""
    given = [f"--aiter {aiter}"] * (aiter is not None) + \
        [f"--primus-turbo {primus_turbo}"] * (primus_turbo is not None)
    if arch is None:
        if given:
            verb = "describes" if len(given) == 1 else "describe"
            raise ValueError(f"{' and '.join(given)} {verb} a simulated machine; give --arch too")
        return current()
    simulate: dict[str, Any] = {}
    if aiter is not None:
        simulate["aiter"] = aiter
    if primus_turbo is not None:
        if primus_turbo not in ("present", "absent"):
            raise ValueError(f"--primus-turbo {primus_turbo!r} is not valid; accepted: present, "
                             "absent")
        simulate["primus_turbo"] = primus_turbo == "present"
    return PlatformFacts.simulated_rocm(arch, **simulate)


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
        aiter=probe_aiter(normalize_arch(gcn) if gcn else None) if hip else None,
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


def reprobe_aiter() -> PlatformFacts:
    """Probe aiter again into the cached facts; simulated or overridden facts stay as given."""
    global _current
    facts = current()
    if _overrides or facts.simulated or not facts.is_rocm:
        return facts
    _current = replace(facts, aiter=probe_aiter(facts.gfx_arch))
    return _current


@contextlib.contextmanager
def override(facts: PlatformFacts) -> Iterator[PlatformFacts]:
    """Make :func:`current` return ``facts`` inside the ``with`` block."""
    _overrides.append(facts)
    try:
        yield facts
    finally:
        _overrides.remove(facts)
