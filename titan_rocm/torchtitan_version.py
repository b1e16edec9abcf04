"""Which TorchTitan is installed, read from the API its files have: TorchTitan is never imported.

titan-rocm has one adapter per TorchTitan generation: model converters for 0.2.2
(``titan_rocm.adapters.tt022.converters``, ``[model] converters = ["rocm"]``) and a trainer
adapter for 0.3.0 (``titan_rocm.adapters.tt030``, typed as ``titan_rocm.torchtitan``). Each
entry point asks :func:`require` first, so a user who calls the one for the other generation
gets a sentence naming what is installed and the entry point that fits it,
instead of an ImportError from deep inside TorchTitan.

The generation is the API shape the installed package has (:func:`detect`), not its version
string: TorchTitan main reports 0.2.2 (``assets/version.txt`` at pytorch/torchtitan b5bcd76c)
but has 0.3.0's config functions and no ``torchtitan/protocols/model_converter.py``. Importing
TorchTitan costs seconds and, in 0.3.0, fixes its device type for the process, so the probe
finds the package with ``importlib.util.find_spec`` (which does not run a top-level package)
and looks at its files.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Series = Literal["0.2", "0.3"]
"""The TorchTitan release lines titan-rocm has an adapter for."""

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
"""What a user of each release line should use instead, for the error sentence."""

_VERSION = re.compile(r"^(\d+)\.(\d+)")


class TorchTitanVersionError(RuntimeError):
    """The installed TorchTitan is not the one this titan-rocm entry point is for.

    A RuntimeError, not an ImportError: TorchTitan 0.3.0's ``--module`` loader swallows
    ImportErrors and would replace this sentence with its own "cannot import module".
    """


def installed() -> str | None:
    """The installed ``torchtitan`` distribution's version, or None when it is not installed."""
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
"""Files (under the ``torchtitan`` package) that each generation's API has, all of them."""

FOLDED_TOKENS = "folded_tokens"
"""The variant of a 0.3-shaped TorchTitan whose batch is folded into the token dimension:
pytorch/torchtitan #4121 (commit 73aed7f6) made tokens, positions and hidden states ``[T]`` /
``[T, D]`` and q/k/v ``(T, N, H)`` instead of ``(B, L, N, H)``. Workarounds whose seam reads the
attention layout take that variant's seam (``workarounds/seams.py``, ``Generation.variants``)."""
FOLDED_TOKENS_MARKER = ("config/configs.py", "num_tokens_per_microbatch_per_dp_rank")
"""How :data:`FOLDED_TOKENS` shows in the files: #4121 renamed ``training.local_batch_size`` to
this field (pytorch/torchtitan b5bcd76c, ``torchtitan/config/configs.py``)."""


@dataclass(frozen=True)
class UnreadShape:
    """A change to a 0.3-shaped TorchTitan that one workaround's seam was not written
    against, read from the files: the seam is then moved (``auto`` skips with
    :attr:`reason`, ``on`` fails with it)."""

    workaround: str
    path: str
    """A file under the ``torchtitan`` package."""
    lacks: str | None
    """None: the file's existence is the change; else the change is the file lacking this
    text (or being absent)."""
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
"""Changes on TorchTitan main that titan-rocm's seams have not been written against."""

SUPPORTED = "titan-rocm supports TorchTitan 0.2.2 (converters) and 0.3.0 (config functions)"


@dataclass(frozen=True)
class Installed:
    """What :func:`detect` found: the distribution's version and the API its files have."""

    version: str | None
    """The ``torchtitan`` distribution's version (what it says, not what it is)."""
    location: str | None = None
    """The ``torchtitan`` package directory, None when none is importable."""
    shape: Series | None = None
    """The generation whose API the files have, None for neither."""
    found: tuple[str, ...] = ()
    """Every marker of :data:`SHAPES` that exists, for the sentence."""
    moved: Mapping[str, str] = field(default_factory=dict)
    """Workaround -> why its seam does not fit this TorchTitan (a known shape that moved)."""
    variants: tuple[str, ...] = ()
    """Variants of its shape some seams differ by (:data:`FOLDED_TOKENS`)."""

    def describe(self) -> str:
        """One phrase naming it, e.g. ``torchtitan 0.2.2 (with TorchTitan 0.3's API)``."""
        if self.location is None:
            return "no torchtitan"
        text = f"torchtitan {self.version or '(no version metadata)'}"
        if self.shape is not None and series(self.version) != self.shape:
            text += f" (with TorchTitan {self.shape}'s API)"
        return text

    def unsupported(self) -> str | None:
        """The sentence for a TorchTitan with neither API shape (None: it has one)."""
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
    """Which TorchTitan generation is installed, from its files (nothing is imported).

    Args:
        package_dir: the ``torchtitan`` package directory to judge (default: the importable
            one; tests pass stand-ins).
    """
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
    """The installed TorchTitan's generation (``"0.2"``/``"0.3"``, from its API; None for
    neither or none installed), or, given ``version``, that string's ``"major.minor"``."""
    if version is None:
        return detect().shape
    match = _VERSION.match(version)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def require(wanted: Series, entry: str, version: str | None = None,
            found: Installed | None = None, advice: str | None = None) -> str:
    """Raise unless the installed TorchTitan has generation ``wanted``'s API; return its version.

    Args:
        wanted: the generation ``entry`` is written for.
        entry: what the user called, for the sentence (e.g. ``"titan_rocm.torchtitan"``).
        version: judge this version string instead of the installed files (tests).
        found: judge this :func:`detect` result instead of the installed one (tests).
        advice: what to do instead, for an entry the other generation has no twin of
            (default: the installed generation's entry point, :data:`ENTRY_POINTS`).

    Raises:
        TorchTitanVersionError: naming ``entry``, what is installed and what to use.
    """
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
