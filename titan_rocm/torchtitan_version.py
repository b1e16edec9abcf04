"""Which TorchTitan is installed, read from the API its files have: TorchTitan is never imported.

The generation is the API shape, not the version string: TorchTitan main reports 0.2.2
(``assets/version.txt`` at pytorch/torchtitan b5bcd76c) but has 0.3.0's API. Files are read,
not imported: importing costs seconds and, in 0.3.0, fixes the device type."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Series = Literal["0.2", "0.3"]

ENTRY_POINTS: dict[str, str] = {
    "0.2": (
        'the model converters: [model] converters = ["rocm"] with '
        '[experimental] custom_import = "titan_rocm", or python -m titan_rocm.train '
        "(README, 'Use it with TorchTitan 0.2.2')"
    ),
    "0.3": (
        "the trainer adapter: return rocm(cfg) from a config function, or "
        "python -m torchtitan.train --module titan_rocm.torchtitan.configs --config <name> "
        "(docs/torchtitan-0.3.md)"
    ),
}

_VERSION = re.compile(r"^(\d+)\.(\d+)")


class TorchTitanVersionError(RuntimeError):
    """The installed TorchTitan is not the one this entry point is for.

    A RuntimeError, because TorchTitan 0.3.0's ``--module`` loader swallows ImportErrors."""


def installed() -> str | None:
    """None when it is not installed."""
    try:
        return importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        return None


SHAPES: dict[str, tuple[str, ...]] = {
    # pytorch/torchtitan v0.2.2 (73a0e697): converters and the TOML JobConfig.
    "0.2": ("protocols/model_converter.py", "config/job_config.py"),
    # 0.3.0 (and main at b5bcd76c): config functions over Configurable, torchtitan/trainer.py.
    "0.3": ("config/configurable.py", "trainer.py"),
}

FOLDED_TOKENS = "folded_tokens"
"""The batch folded into the token dimension (pytorch/torchtitan #4121, 73aed7f6: q/k/v
``(T, N, H)`` instead of ``(B, L, N, H)``); seams that read the attention layout differ by it."""
FOLDED_TOKENS_MARKER = ("config/configs.py", "num_tokens_per_microbatch_per_dp_rank")
"""#4121 renamed ``training.local_batch_size`` to this (b5bcd76c, ``config/configs.py``)."""


@dataclass(frozen=True)
class UnreadShape:
    """A TorchTitan change one workaround's seam was not written against (``auto`` skips with
    :attr:`reason`, ``on`` fails with it)."""

    workaround: str
    path: str
    lacks: str | None
    """None: the file's existence is the change; else the file lacking this text is."""
    reason: str


UNREAD_SHAPES: tuple[UnreadShape, ...] = (
    # pytorch/torchtitan #4164/#4165 (open at b5bcd76c, where attention is the module
    # models/common/attention.py): the inner attentions move into a package.
    UnreadShape(
        "mla_ck_backward", "models/common/attention/__init__.py", None,
        "this TorchTitan's attention is a package (torchtitan/models/common/attention/, "
        "pytorch/torchtitan #4164), not the module attention.py whose FlexAttention and "
        "VarlenAttention titan-rocm's MLA seam was written against; its attention is left as "
        "TorchTitan built it",
    ),
    # pytorch/torchtitan #4539 (open at b5bcd76c): RoutedExperts' inner GroupedExperts gives
    # way to w13/w2 GroupedLinear children. The class name is grouped_mm/seams_tt030.py's
    # EXPERTS_CLASS (a test holds the two equal).
    UnreadShape(
        "grouped_mm", "models/common/moe.py", "class GroupedExperts(",
        "this TorchTitan's torchtitan/models/common/moe.py defines no GroupedExperts, the "
        "experts class titan-rocm's grouped-MM seam binds (pytorch/torchtitan #4539 replaces "
        "it with w13/w2 GroupedLinear modules); its experts are left as TorchTitan built them",
    ),
)

SUPPORTED = "titan-rocm supports TorchTitan 0.2.2 (converters) and 0.3.0 (config functions)"


@dataclass(frozen=True)
class Installed:
    """What :func:`detect` found: the distribution's version and the API its files have."""

    version: str | None
    """What it says, not what it is."""
    location: str | None = None
    shape: Series | None = None
    found: tuple[str, ...] = ()
    moved: Mapping[str, str] = field(default_factory=dict)
    variants: tuple[str, ...] = ()

    def describe(self) -> str:
        """E.g. ``torchtitan 0.2.2 (with TorchTitan 0.3's API)``."""
        if self.location is None:
            return "no torchtitan"
        text = f"torchtitan {self.version or '(no version metadata)'}"
        if self.shape is not None and series(self.version) != self.shape:
            text += f" (with TorchTitan {self.shape}'s API)"
        return text

    def unsupported(self) -> str | None:
        if self.location is None or self.shape is not None:
            return None
        found = ", ".join(self.found) or "none of them"
        wanted = "; ".join(f"{k}: {', '.join(v)}" for k, v in SHAPES.items())
        return (
            f"{self.describe()} at {self.location} has neither API titan-rocm knows "
            f"(found {found}; looked for {wanted}); {SUPPORTED}"
        )


def _package_dir() -> Path | None:
    try:
        spec = importlib.util.find_spec("torchtitan")  # a top-level spec runs nothing
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def detect(package_dir: str | Path | None = None) -> Installed:
    """Which TorchTitan generation is installed, from its files (tests pass a stand-in dir)."""
    root = Path(package_dir) if package_dir is not None else _package_dir()
    version = installed()
    if root is None:
        return Installed(version)
    found = tuple(m for markers in SHAPES.values() for m in markers if (root / m).is_file())
    shapes = [s for s, markers in SHAPES.items() if all(m in found for m in markers)]
    # Both (a tree with leftovers of each): the newer API is the one its trainer runs.
    shape = shapes[-1] if shapes else None
    moved: dict[str, str] = {}
    variants: list[str] = []
    if shape == "0.3":
        marker_file, marker = FOLDED_TOKENS_MARKER
        if marker in _read(root / marker_file):
            variants.append(FOLDED_TOKENS)
        moved.update((s.workaround, s.reason) for s in UNREAD_SHAPES if _changed(root, s))
    return Installed(version, str(root), shape, found, moved,  # type: ignore[arg-type]
                     tuple(variants))


def _changed(root: Path, shape: UnreadShape) -> bool:
    if shape.lacks is None:
        return (root / shape.path).is_file()
    return shape.lacks not in _read(root / shape.path)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def series(version: str | None = None) -> str | None:
    """``"0.2"``/``"0.3"`` of the installed API (None for neither), or of ``version``."""
    if version is None:
        return detect().shape
    match = _VERSION.match(version)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def require(wanted: Series, entry: str, version: str | None = None,
            found: Installed | None = None, advice: str | None = None) -> str:
    """Raise TorchTitanVersionError (naming ``entry``, what is installed and what to use) unless the
    installed TorchTitan has ``wanted``'s API; return its version. ``version`` and ``found``
    stand in for the installed files (tests)."""
    if version is not None:  # a version string alone: judged by its major.minor
        shape, have = series(version), f"torchtitan {version} is installed"
    else:
        found = detect() if found is None else found
        unsupported = found.unsupported()
        if unsupported:
            raise TorchTitanVersionError(f"{entry} is for TorchTitan {wanted}.x, but {unsupported}")
        version, shape = found.version or "unknown", found.shape
        have = ("no torchtitan is installed" if found.location is None
                else f"{found.describe()} is installed")
    if shape == wanted:
        return version
    if advice is None:
        advice = ENTRY_POINTS.get(shape or "", f"install torchtitan {wanted}.x")
        if shape in ENTRY_POINTS:
            advice = f"with it, use {advice}"
    raise TorchTitanVersionError(
        f"{entry} is for TorchTitan {wanted}.x, but {have}; {advice}"
    )
