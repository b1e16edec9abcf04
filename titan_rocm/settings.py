"""titan-rocm's settings: the ``[rocm]`` section, the same for every TorchTitan version.

:class:`RocmSettings` is a plain dataclass. TorchTitan 0.2.2 parses it as the ``[rocm]``
TOML section and the ``--rocm.<field>`` flags (:mod:`titan_rocm.config` merges it into its
``JobConfig``); other front ends fill it their own way. Every accepted value of a field is
written once, in its ``Literal`` annotation: validation, the docs' choices and the workers'
environment checks all derive from it (:func:`choices`).
"""

import typing
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from titan_rocm.numbers import Bounds, refusal

Mode = Literal["auto", "on", "off"]
"""A workaround's mode: ``on`` requires it (start-up fails, naming what is missing), ``auto``
applies it where its preconditions hold and otherwise logs once why not, ``off`` does nothing."""
HazardRule = Literal["precise", "conservative"]
"""The buffer-store hazard rule offered to users (docs/triton-buffer-store-hazard.md)."""
DEFAULT_HAZARD_RULE: HazardRule = "precise"
"""The one default of ``triton_war_rule``, also of ``titan-rocm scan --rule`` and the scanner."""
DivergenceCheck = Literal["log_steps", "every_step", "every_step_exact"]
"""When the divergence guard reads its device-side record (docs/divergence-detection.md)."""
MoEEagerScope = Literal["block", "moe"]
"""What ``rocm.moe_eager_compile`` leaves eager in each MoE TransformerBlock: the whole block,
or only its MoE module (attention and norms then compile; docs/moe-eager-compile.md)."""
MoECombine = Literal["fp32", "bf16"]
"""How the MoE modules ``rocm.moe_eager_compile`` keeps eager (TorchTitan 0.2.2) combine their
experts' outputs: TorchTitan's bmm over an FP32 copy, or the weighted sum of AMD-AGI/Primus PR
#962 (merged) over the BF16 outputs (no FP32 copy kept for the backward;
docs/moe-eager-compile.md)."""
GroupedMMPrecision = Literal["auto", "bf16", "fp8"]
"""The precision of the ``primus_turbo`` grouped-MM backend (docs/grouped-mm.md)."""
DocumentMasks = Literal["keep", "drop"]
"""What MLA on aiter does with per-document (``block_causal``) attention masks."""
NumericsAudit = Literal["off", "first_step", "every_n_steps"]
"""When training audits its gradients against eager references (docs/numerics-audit.md)."""
NumericsAuditPolicy = Literal["warn", "stop", "quarantine"]
"""What a flagged in-training audit does: log the table and go on, or stop the run."""
NumericsAuditReference = Literal["auto", "float64", "float32", "tf32"]
"""The audit's high-precision arithmetic: auto (float64 for a float32 job, tf32 for a bfloat16
one, float32 for float16), float64, float32, or float32 with TF32 GEMMs where the GPU has
them (docs/numerics-audit.md)."""

MODES: tuple[str, ...] = typing.get_args(Mode)


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
    moe_eager_scope: MoEEagerScope = "block"
    """What stays eager in each MoE block: the whole block (``block``, the fix AMD-AGI/Primus
    PR #962, merged, validated on MI300X); or only its MoE module (router, token permutation,
    experts, shared experts), with attention and norms compiled fullgraph (``moe``: faster on
    an H200, unvalidated on ROCm, where Primus found compiling the outer MoE block still
    NaNs)."""
    moe_combine: MoECombine = "fp32"
    """How eager MoE modules combine their experts' outputs: ``fp32`` (TorchTitan's bmm over
    an FP32 copy) or ``bf16`` (Primus's weighted sum, no FP32 copy; TorchTitan 0.2.2 only)."""
    grouped_mm: Mode = "auto"
    """Bind the MoE grouped-MM function of the live model to ``grouped_mm_backend``."""
    grouped_mm_backend: str = "auto"
    """Grouped-MM backend: auto, torch, loop, primus_turbo, or a name registered with
    ``titan_rocm.workarounds.grouped_mm.register_backend``."""
    grouped_mm_precision: GroupedMMPrecision = "auto"
    """primus_turbo's GEMMs: fp8 (Primus-Turbo's grouped_gemm_fp8, E4M3 tensorwise, as
    AMD-AGI/Primus trains DeepSeek), bf16, or auto: fp8 when the job's experts are float8
    (quantize.grouped_mm.float8) and the installed Primus-Turbo has grouped_gemm_fp8."""
    triton_war: Mode = "auto"
    """Scan each HIP kernel for the buffer-store data hazard (a write-after-read, "WAR",
    hazard on the store's data registers); recompile hazardous ones with buffer ops off."""
    triton_war_rule: HazardRule = DEFAULT_HAZARD_RULE
    """Hazard rule: precise (LLVM's wait-state window) or conservative (2 wait states
    for every soffset)."""
    triton_war_strict: bool = False
    """Raise instead of logging an error when a hazardous kernel cannot be fixed."""
    mla_ck_backward: Mode = "auto"
    """DeepSeek MLA attention on aiter, routed by the real arch (backward for q/k 192, v 128
    to CK on gfx942)."""
    mla_document_masks: DocumentMasks = "keep"
    """FlexAttention flavors with per-document (block_causal) masks: keep them (aiter's varlen
    attention within each document) or drop them (aiter's plain causal kernel: tokens attend
    across document boundaries)."""
    divergence_guard: Mode = "auto"
    """Stop training at the first non-finite loss or grad norm (auto = every platform)."""
    divergence_check: DivergenceCheck = "log_steps"
    """When the guard reads its device-side record: at TorchTitan's log steps and the end
    of training (no extra host sync); every step, one step late (each step's record is read
    at the end of the next one, once it has landed: no wait in steady state); or every step
    exactly (the step's own record at its end: one wait for the device per step)."""
    gemm_lookup: Mode = "auto"
    """Compile GEMMs with the validated kernels of ``gemm_lookup_table`` (auto: when a table
    is named), ATen on a miss; never autotune at start-up."""
    gemm_lookup_table: str = ""
    """Path of a table written by ``titan-rocm tune table`` (empty: none)."""
    numerics_audit: NumericsAudit = "off"
    """Audit the step block by block before the first optimizer step (``first_step``) or
    every ``numerics_audit_every`` steps: each block's compiled forward and backward against
    eager and high-precision replays from the job's own inputs (docs/numerics-audit.md)."""
    numerics_audit_every: int = 1000
    """Steps between audits under ``every_n_steps`` (the first step is audited too)."""
    numerics_audit_spread: int = 7
    """Steps one in-training audit is spread over: the blocks dealt into ``spread - 1``
    steps, then one step for the embedding, the head and the end-to-end loss (1: the whole
    audit in one step). Each audited step then costs about a ``spread``-th of the audit (7:
    at most 3 steps each with the children compared, docs/numerics-audit.md#cost)."""
    numerics_audit_policy: NumericsAuditPolicy = "warn"
    """A flagged in-training audit: ``warn`` logs it and trains on, ``stop`` ends the run,
    ``quarantine`` redoes the flagged micro-batch with the flagged segment eager (no gradient
    of the flagged pass is applied) and keeps that segment eager for the rest of the run; a
    later audit flagging it again, or a flag quarantine cannot act on, ends the run."""
    numerics_audit_reference: NumericsAuditReference = "auto"
    """The high-precision replay's arithmetic (auto: float64 for a float32 job, tf32 for
    bfloat16, float32 for float16)."""
    numerics_audit_submodules: Mode = "auto"
    """Also compare each compiled block's children (attention, feed-forward or MoE, norms) on
    their own, from a probed compiled copy of the block (auto: blocks that cannot be probed are
    compared as a whole, said once; docs/numerics-audit.md#inside-a-block)."""
    numerics_audit_fudge: float = 3.0
    """Flag a parameter's gradient (or the loss) whose error exceeds fudge x the eager error
    + the floor."""
    numerics_audit_activation_fudge: float = 1.5
    """The same for a block's output and the gradient at its input."""
    numerics_audit_child_fudge: float = 2.0
    """The same for a block child's parameter gradients, compared alone
    (numerics_audit_submodules)."""
    numerics_audit_child_activation_fudge: float = 1.2
    """The same for a block child's output and the gradient at its input."""
    numerics_audit_floor_eps: float = 64.0
    """The additive floor of the relative error, in float32 machine epsilons."""
    numerics_audit_outlier_k: float = 10.0
    """Outlier element: job error above k x the eager error's outlier quantile (plus the
    compute dtype's relative tolerance of the element)."""
    numerics_audit_outlier_quantile: float = 0.999
    """The quantile of the eager error outliers are measured against."""
    numerics_audit_outlier_max: float = 0.001
    """Flag a tensor with more than this fraction of outlier elements."""

    def __post_init__(self) -> None:
        validate(self)


MAY_BE_EMPTY: tuple[str, ...] = ("gemm_lookup_table",)
"""String settings whose empty value means "none"."""

NUMBERS: dict[str, Bounds] = {
    "numerics_audit_every": Bounds(int, 1, 10**9),
    "numerics_audit_spread": Bounds(int, 1, 10**6),
    "numerics_audit_fudge": Bounds(float, 0, 1e6, low_open=True),
    "numerics_audit_activation_fudge": Bounds(float, 0, 1e6, low_open=True),
    "numerics_audit_child_fudge": Bounds(float, 0, 1e6, low_open=True),
    "numerics_audit_child_activation_fudge": Bounds(float, 0, 1e6, low_open=True),
    "numerics_audit_floor_eps": Bounds(float, 0, 1e9, low_open=True),
    "numerics_audit_outlier_k": Bounds(float, 0, 1e6, low_open=True),
    "numerics_audit_outlier_quantile": Bounds(float, 0, 1, low_open=True, high_open=True),
    "numerics_audit_outlier_max": Bounds(float, 0, 1, low_open=True),
}
"""The accepted range of every numeric setting (:class:`~titan_rocm.numbers.Bounds`): each
int or float field of :class:`RocmSettings` has one (a test holds it; there is no default)."""


def check_number(key: str, value: Any) -> float | int:
    """``value`` of the numeric setting ``key`` (a :data:`NUMBERS` key), checked.

    Raises:
        ValueError: ``[rocm] KEY = VALUE is not valid; accepted: ...``.
    """
    return NUMBERS[key].check(value, f"[rocm] {key} =")


def choices(annotation: Any) -> tuple[str, ...] | None:
    """The accepted values of a ``Literal`` annotation (None for any other type)."""
    if typing.get_origin(annotation) is Literal:
        return tuple(typing.get_args(annotation))
    return None


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
        name = f"[rocm] {f.name} ="
        accepted = choices(f.type)
        if accepted is not None:
            if value not in accepted:
                raise ValueError(refusal(name, value, ", ".join(accepted)))
        elif f.type is bool:
            if not isinstance(value, bool):
                raise ValueError(refusal(name, value, "true, false"))
        elif f.type in (int, float):
            check_number(f.name, value)
        elif f.type is str:
            if not isinstance(value, str) or not (value or f.name in MAY_BE_EMPTY):
                raise ValueError(refusal(name, value, "a non-empty string"))


def check_section(section: Any) -> RocmSettings:
    """Validate a raw ``[rocm]`` table from a TOML file, unknown keys included: TorchTitan reports
    unknown keys without listing the accepted ones.

    Raises:
        ValueError: naming the key or value and what is accepted.
    """
    if not isinstance(section, dict):
        raise ValueError(f"[rocm] must be a table of settings, got {section!r}")
    known = [f.name for f in fields(RocmSettings)]
    for key in section:
        if key not in known:
            raise ValueError(f"[rocm] has unknown key {key!r}; accepted keys: {', '.join(known)}")
    return RocmSettings(**section)


def check_flags(args: Sequence[str]) -> None:
    """Validate the values of ``--rocm.<field> VALUE`` (or ``=VALUE``) flags that tyro would
    report only as "Error parsing rocm" (a number out of :data:`NUMBERS`' range, an empty
    string); what tyro explains itself is left to it.

    Raises:
        ValueError: naming the key, the bad value and the accepted values.
    """
    types = {f.name: f.type for f in fields(RocmSettings)}
    for i, arg in enumerate(args):
        if not arg.startswith(("--rocm.", "--rocm-")):
            continue
        key, eq, text = arg[len("--rocm."):].partition("=")
        name = key.replace("-", "_")
        if types.get(name) not in (int, float, str):
            continue
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                continue
            text = args[i + 1]
        value: Any = text
        if types[name] in (int, float):
            try:
                value = types[name](text)
            except ValueError:
                continue
        RocmSettings(**{name: value})


def coerce(settings: Any) -> RocmSettings:
    """``RocmSettings`` from what a front end parsed: the dataclass (validated), a raw ``[rocm]``
    dict, None (defaults), or any object with these fields (another extension's dataclass).
    """
    if settings is None:
        return RocmSettings()
    if isinstance(settings, RocmSettings):
        validate(settings)
        return settings
    if isinstance(settings, dict):
        return check_section(settings)
    values = {f.name: getattr(settings, f.name) for f in fields(RocmSettings)
              if hasattr(settings, f.name)}
    return RocmSettings(**values)
