"""The ``[rocm]`` section of a TorchTitan job config, and the ``--rocm.<field>`` flags.

TorchTitan 0.2.2 extends its ``JobConfig`` through ``job.custom_config_module``: set
``[job] custom_config_module = "titan_rocm.config"`` in the TOML (or
``--job.custom_config_module titan_rocm.config``) and ``ConfigManager`` merges the
:class:`JobConfig` below, so ``[rocm]`` keys and ``--rocm.*`` flags parse together
(CLI over TOML over defaults). ``--experimental.custom_args_module`` does NOT work for
this in 0.2.2: it is copied to ``job.custom_config_module`` only after parsing.

A job that never mentions ``[rocm]`` gets :class:`RocmSettings` defaults
(:func:`settings_from`).
"""

from dataclasses import dataclass, field, fields
from typing import Any, Literal

Mode = Literal["auto", "on", "off"]
MODES: tuple[str, ...] = ("auto", "on", "off")

CONFIG_MODULE = "titan_rocm.config"


@dataclass
class RocmSettings:
    """titan-rocm settings (the ``[rocm]`` TOML section). Every default does the right thing.

    Each workaround has a mode: ``auto`` applies it on ROCm when its preconditions hold,
    ``on`` applies it on any platform (for testing on CUDA/CPU), ``off`` never applies it.
    """

    precision_casts: Mode = "auto"
    """Set Inductor's emulate_precision_casts before anything compiles."""
    moe_eager_compile: Mode = "auto"
    """Compile dense TransformerBlocks whole (fullgraph); leave MoE blocks eager."""
    grouped_mm: Mode = "auto"
    """Bind the MoE grouped-MM function of the live model to ``grouped_mm_backend``."""
    grouped_mm_backend: str = "auto"
    """Grouped-MM backend: auto, torch, loop, primus_turbo, or a name registered with
    ``titan_rocm.workarounds.grouped_mm.register_backend``."""
    triton_war: Mode = "auto"
    """Scan each HIP kernel for the buffer-store data hazard; recompile hazardous ones
    with buffer ops off."""
    triton_war_rule: Literal["precise", "conservative"] = "precise"
    """Hazard rule: precise (LLVM's wait-state window) or conservative (2 wait states
    for every soffset)."""
    triton_war_strict: bool = False
    """Raise instead of logging an error when a hazardous kernel cannot be fixed."""
    mla_ck_backward: Mode = "auto"
    """DeepSeek MLA attention on aiter; backward for q/k 192, v 128 to CK on gfx942."""
    mla_document_masks: Literal["keep", "drop"] = "keep"
    """FlexAttention flavors with per-document (block_causal) masks: keep them (the model's
    attention is then not replaced) or drop them (aiter's plain causal kernel: tokens attend
    across document boundaries)."""
    divergence_guard: Mode = "auto"
    """Stop training at the first non-finite loss or grad norm (auto = every platform)."""
    divergence_check: Literal["log_steps", "every_step"] = "log_steps"
    """When the guard reads its device-side record: at TorchTitan's log steps and the end
    of training (no extra host sync), or every step (one sync per step)."""
    gemm_lookup: Mode = "auto"
    """Compile GEMMs with the validated kernels of ``gemm_lookup_table`` (auto: when a table
    is named), ATen on a miss; never autotune at start-up."""
    gemm_lookup_table: str = ""
    """Path of a table written by ``titan-rocm tune table`` (empty: none)."""

    def __post_init__(self) -> None:
        validate(self)


_MAY_BE_EMPTY: tuple[str, ...] = ("gemm_lookup_table",)
"""String settings whose empty value means "none"."""

_CHOICES: dict[str, tuple[str, ...]] = {
    "triton_war_rule": ("precise", "conservative"),
    "divergence_check": ("log_steps", "every_step"),
    "mla_document_masks": ("keep", "drop"),
}


def mode_fields() -> tuple[str, ...]:
    """Names of the per-workaround mode fields, in declaration order."""
    return tuple(f.name for f in fields(RocmSettings) if f.type is Mode)


def validate(settings: RocmSettings) -> None:
    """Check every ``[rocm]`` value.

    Raises:
        ValueError: naming the key, the bad value and the accepted values.
    """
    for f in fields(settings):
        value = getattr(settings, f.name)
        if f.type is Mode:
            accepted: tuple[str, ...] | None = MODES
        else:
            accepted = _CHOICES.get(f.name)
        if accepted is not None:
            if value not in accepted:
                raise ValueError(
                    f"[rocm] {f.name} = {value!r} is not valid; accepted: {', '.join(accepted)}"
                )
        elif f.type is bool:
            if not isinstance(value, bool):
                raise ValueError(
                    f"[rocm] {f.name} = {value!r} is not valid; accepted: true, false"
                )
        elif f.type is str:
            if not isinstance(value, str) or not (value or f.name in _MAY_BE_EMPTY):
                raise ValueError(
                    f"[rocm] {f.name} = {value!r} is not valid; accepted: a non-empty string"
                )


def check_section(section: Any) -> None:
    """Validate a raw ``[rocm]`` table from a TOML file (unknown keys included).

    TorchTitan reports unknown keys without listing the accepted ones; titan-rocm's own
    entry points call this first for a clearer message.

    Raises:
        ValueError: naming the key or value and what is accepted.
    """
    if not isinstance(section, dict):
        raise ValueError(f"[rocm] must be a table of settings, got {section!r}")
    known = [f.name for f in fields(RocmSettings)]
    for key in section:
        if key not in known:
            raise ValueError(f"[rocm] has unknown key {key!r}; accepted keys: {', '.join(known)}")
    RocmSettings(**section)


@dataclass
class JobConfig:
    """TorchTitan JobConfig extension merged by ``ConfigManager`` (``job.custom_config_module``)."""

    rocm: RocmSettings = field(default_factory=RocmSettings)


def settings_from(job_config: Any) -> RocmSettings:
    """The ``[rocm]`` settings of a (possibly not extended) TorchTitan job config.

    A job config parsed without ``titan_rocm.config`` has no ``rocm`` attribute: defaults.
    """
    settings = getattr(job_config, "rocm", None)
    if settings is None:
        return RocmSettings()
    if isinstance(settings, RocmSettings):
        validate(settings)
        return settings
    if isinstance(settings, dict):
        check_section(settings)
        return RocmSettings(**settings)
    # A merged dataclass from another extension that also defines ``rocm``: copy fields.
    values = {f.name: getattr(settings, f.name) for f in fields(RocmSettings) if hasattr(
        settings, f.name)}
    return RocmSettings(**values)
