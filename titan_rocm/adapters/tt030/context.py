"""The workarounds' :class:`~titan_rocm.workarounds.base.Context` of a TorchTitan 0.3.0 job: the
only place it is made."""

from __future__ import annotations

from typing import Any

from titan_rocm import platform, torchtitan_version
from titan_rocm.settings import RocmSettings, coerce
from titan_rocm.workarounds.base import TORCHTITAN_030, CompileSettings, Context, Parallelism
from titan_rocm.workarounds.seams import TT030

QUANTIZED_EXPERTS = {"Float8": "quantize.grouped_mm.float8", "MXFP8": "quantize.grouped_mm.mx"}
"""0.3.0 has no converter names: its quantization converters subclass the experts' class
(``Float8<cls>``, ``MXFP8<cls>``). Named as 0.2.2 names them, so workarounds decide with one
vocabulary."""


def quantized_experts(model_config: Any) -> tuple[str, ...]:
    """The 0.2.2 names of the experts quantizations in a 0.3.0 model config tree (none without
    ``GroupedExperts``: pytorch/torchtitan #4539's ``GroupedLinear``)."""
    try:
        from torchtitan.models.common.moe import GroupedExperts
    except ImportError:
        return ()

    found: set[str] = set()
    for _fqn, experts, _parent, _attr in model_config.traverse(GroupedExperts.Config):
        owner = getattr(type(experts), "_owner", None)
        name = getattr(owner, "__name__", "")
        found.update(n for prefix, n in QUANTIZED_EXPERTS.items() if name.startswith(prefix))
    return tuple(sorted(found))


def job_context(config: Any, parallel_dims: Any, settings: RocmSettings | None = None,
                parallelize_fn: Any = None) -> Context:
    """The :class:`Context` of a 0.3.0 job; ``parallel_dims`` None is one rank (ValueError for a bad
    ``rocm`` value)."""
    settings = coerce(getattr(config, "rocm", None) if settings is None else settings)
    spec = config.model_spec
    compile_config = config.compile
    return Context(
        settings=settings,
        platform=platform.current(),
        model_name=getattr(spec, "name", None),
        flavor=getattr(spec, "flavor", None),
        compile=CompileSettings(
            enable=bool(compile_config.enable),
            backend=compile_config.backend or "inductor",
            components=tuple(compile_config.components),
        ),
        parallel=Parallelism.of(parallel_dims),
        training_dtype=str(config.training.dtype),
        mixed_precision_param=str(config.training.mixed_precision_param),
        deterministic=bool(config.debug.deterministic),
        converters=quantized_experts(spec.model) if spec is not None else (),
        parallelize_fn=parallelize_fn or getattr(spec, "parallelize_fn", None),
        framework=TORCHTITAN_030,
        # The installed TorchTitan's seams: its variants' (main's folded tokens) and moved ones.
        generation=TT030.for_installed(torchtitan_version.detect()),
    )
