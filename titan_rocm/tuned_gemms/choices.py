"""Inductor choices handlers for GEMM lowerings: record (collect), enumerate (tune run), table.

A lowering may ask ``V.choices`` for candidates several times, so :func:`install_lowering_hook`
wraps ``AlgorithmSelectorCache.__call__`` to tell a handler where each lowering ends. Installed
through ``inductor_choices_class``, not ``V.set_choices_handler`` alone: the handler is
thread-local, and the backward is lowered lazily in the autograd thread."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import torch._inductor.config as inductor_config
from torch._inductor.choices import InductorChoices
from torch._inductor.kernel_template_choice import KernelTemplateChoice
from torch._inductor.lookup_table.choices import LookupTableChoices
from torch._inductor.select_algorithm import AlgorithmSelectorCache, ExternKernelChoice
from torch._inductor.virtualized import V

from titan_rocm import patches
from titan_rocm.log import log, log_once
from titan_rocm.tuned_gemms.problems import GEMM_OPS, Call, Problem, Template, TensorSpec


def _template_params_class() -> type:
    """Inductor's ``DictKernelTemplateParams``: in ``torch._inductor.heuristics.template`` since
    torch 2.14, else torch 2.13's ``torch._inductor.template_heuristics`` (a shim in 2.14 and 2.15).
    """
    try:
        from torch._inductor.heuristics.template.params import DictKernelTemplateParams
    except ImportError:
        from torch._inductor.template_heuristics.params import DictKernelTemplateParams
    return DictKernelTemplateParams


DictKernelTemplateParams = _template_params_class()

BY = "gemm choices"
"""Who makes the settings and the patch :func:`install` makes (:mod:`titan_rocm.patches`)."""

AUTOHEURISTIC_OP = "mm-ah"
"""tuned_mm's extra request for AutoHeuristic's configs: never answered by these handlers."""

GEMM_SETTINGS: dict[str, Any] = {
    "max_autotune_gemm": True,
    "max_autotune_gemm_backends": "ATEN,TRITON",
}
"""Inductor settings under which Triton templates are offered; CUTLASS/CK/CPP choices come after the
handler and are left out."""


def _hint(expr: Any) -> int:
    sizevars = V.graph.sizevars
    for name in ("optimization_hint", "size_hint"):
        fn = getattr(sizevars, name, None)
        if fn is not None:
            try:
                return int(fn(expr))
            except Exception:  # noqa: BLE001 - a layout without a hint: offset 0
                continue
    return 0


def call_key(kernel_inputs: Any, op: str) -> str:
    """The device-agnostic lookup key Inductor's lookup table uses for this call."""
    return f"{LookupTableChoices._generate_kernel_inputs_key(kernel_inputs)}+{op}"


def input_specs(kernel_inputs: Any) -> tuple[TensorSpec, ...]:
    """Dtype, hinted shape/stride and offset of each input of a call."""
    specs = []
    for node, dtype, shape, stride in zip(
        kernel_inputs.nodes(), kernel_inputs.dtypes(), kernel_inputs.shapes_hinted(),
        kernel_inputs.strides_hinted(), strict=True,
    ):
        try:
            offset = _hint(node.get_layout().offset)
        except Exception:  # noqa: BLE001 - nodes without a layout: offset 0
            offset = 0
        specs.append(TensorSpec(str(dtype), tuple(map(int, shape)), tuple(map(int, stride)),
                                offset))
    return tuple(specs)


def layout_spec(layout: Any) -> TensorSpec:
    """The output layout of a lowering as a :class:`TensorSpec`."""
    return TensorSpec(str(layout.dtype), tuple(_hint(s) for s in layout.size),
                      tuple(_hint(s) for s in layout.stride), _hint(layout.offset))


def scalars_of(kernel_inputs: Any) -> dict[str, Any]:
    """The call's scalars (``alpha``/``beta`` of addmm and baddbmm), JSON-able."""
    scalars = getattr(kernel_inputs, "_scalars", None) or {}
    return {k: (v if isinstance(v, (int, float, bool)) else str(v)) for k, v in scalars.items()}


def is_extern(template: Any) -> bool:
    """Whether a template is an ATen kernel (``ExternKernelChoice``)."""
    return isinstance(template, ExternKernelChoice)


def ktc_of(choice: Any) -> KernelTemplateChoice | None:
    """The ``KernelTemplateChoice`` a ChoiceCaller was made from (None for CPP/CK/CUTLASS)."""
    annotations = getattr(choice, "annotations", None) or {}
    ktc = annotations.get("ktc")
    return ktc if isinstance(ktc, KernelTemplateChoice) else None


@dataclass
class Lowering:
    """The calls of the GEMM lowering in progress (one per thread's handler)."""

    op: str = ""
    calls: list[Call] = field(default_factory=list)
    scalars: dict[str, Any] = field(default_factory=dict)
    chosen: list[KernelTemplateChoice] = field(default_factory=list)
    """Candidates this handler returned so far."""
    fallback: KernelTemplateChoice | None = None
    """The first ATen candidate offered (the miss path's answer)."""
    hit: bool = False


class GemmChoices(InductorChoices):
    """Base: tracks the calls of each GEMM lowering; subclasses pick the candidates."""

    def __init__(self) -> None:
        super().__init__()
        self._lowering = Lowering()

    def uuid(self) -> str:
        """Part of Inductor's FX-graph cache key (``inductor_choices_class`` requires it)."""
        return type(self).__name__

    def _finalize_template_configs(  # noqa: D102 - Inductor's hook
        self,
        template_choices: dict[str, Generator[KernelTemplateChoice, None, None]],
        kernel_inputs: Any,
        templates: list[Any],
        op_name: str,
        kwarg_overrides: dict[str, dict[str, Any]] | None = None,
    ) -> list[KernelTemplateChoice]:
        if op_name == AUTOHEURISTIC_OP:
            return []
        if op_name not in GEMM_OPS:
            return super()._finalize_template_configs(
                template_choices, kernel_inputs, templates, op_name, kwarg_overrides)
        lowering = self._lowering
        if lowering.op and lowering.op != op_name:
            # The previous lowering returned without reaching the selector: start afresh.
            lowering = self._lowering = Lowering()
        lowering.op = op_name
        lowering.scalars.update(scalars_of(kernel_inputs))
        call = Call(call_key(kernel_inputs, op_name), input_specs(kernel_inputs),
                    tuple(Template(t.uid, getattr(t, "src_hash", None)) for t in templates))
        lowering.calls.append(call)
        chosen = self.choose(lowering, call, template_choices, kernel_inputs, templates,
                             op_name, kwarg_overrides)
        lowering.chosen.extend(chosen)
        return chosen

    def choose(self, lowering: Lowering, call: Call,
               template_choices: dict[str, Generator[KernelTemplateChoice, None, None]],
               kernel_inputs: Any, templates: list[Any], op_name: str,
               kwarg_overrides: dict[str, dict[str, Any]] | None) -> list[KernelTemplateChoice]:
        """The candidates to return for this call."""
        raise NotImplementedError

    def lowering_done(self, name: str, choices: list[Any], input_nodes: Any,
                      layout: Any) -> list[Any]:
        """Called by the selector hook with the lowering's ChoiceCallers; returns those to use."""
        lowering, self._lowering = self._lowering, Lowering()
        if not lowering.calls or name != lowering.op:
            return choices
        problem = Problem(lowering.op, tuple(lowering.calls), layout_spec(layout),
                          dict(lowering.scalars))
        return self.finish(lowering, problem, choices, input_nodes, layout)

    def finish(self, lowering: Lowering, problem: Problem, choices: list[Any],
               input_nodes: Any, layout: Any) -> list[Any]:
        """Settle the lowering's choices."""
        return choices

    @staticmethod
    def first_fallback(lowering: Lowering, template_choices: dict[str, Any],
                       templates: list[Any]) -> list[KernelTemplateChoice]:
        """The lowering's first ATen candidate, returned once per lowering."""
        if lowering.fallback is None:
            for template in templates:
                if is_extern(template):
                    lowering.fallback = next(iter(template_choices[template.uid]), None)
                    if lowering.fallback is not None:
                        break
        if lowering.fallback is None or any(k is lowering.fallback for k in lowering.chosen):
            return []
        return [lowering.fallback]


class SinkChoices(GemmChoices):
    """Base of the tuner's handlers: each lowering's :class:`Problem` goes to ``sink``."""

    NAME = "sink"
    """What :meth:`uuid` calls the handler (its part of the FX-graph cache key)."""

    def __init__(self, sink: Callable[..., Any]) -> None:
        super().__init__()
        self.sink = sink

    def uuid(self) -> str:  # noqa: D102
        return f"titan-rocm-{self.NAME}"


class RecordingChoices(SinkChoices):
    """``tune collect``: record each GEMM lowering; compile it with its ATen kernel only."""

    NAME = "recording"

    def choose(self, lowering, call, template_choices, kernel_inputs, templates, op_name,
               kwarg_overrides):  # noqa: D102
        return self.first_fallback(lowering, template_choices, templates)

    def finish(self, lowering, problem, choices, input_nodes, layout):  # noqa: D102
        self.sink(problem)
        return choices


class EnumeratingChoices(SinkChoices):
    """The minesweeper: every candidate, stock; ``sink`` returns the choices to use."""

    NAME = "enumerating"

    def choose(self, lowering, call, template_choices, kernel_inputs, templates, op_name,
               kwarg_overrides):  # noqa: D102
        return list(InductorChoices._finalize_template_configs(
            self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides))

    def finish(self, lowering, problem, choices, input_nodes, layout):  # noqa: D102
        return self.sink(problem, choices, input_nodes, layout)


class LookupStats:
    """Hits and misses of a table, shared by every thread's handler."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.hits: Counter[str] = Counter()
        self.misses: Counter[str] = Counter()

    def count(self, key: str, hit: bool) -> None:
        """Count one lowering."""
        with self._lock:
            (self.hits if hit else self.misses)[key] += 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-able totals."""
        with self._lock:
            return {"hits": sum(self.hits.values()), "misses": sum(self.misses.values()),
                    "missed_keys": sorted(self.misses)}


class TableChoices(GemmChoices):
    """``rocm.gemm_lookup``: one candidate per GEMM lowering, validated by ``tune run``.

    A key not in the table is a miss: the ATen kernel only, never unvalidated autotuning. A key with
    entries for another call's templates answers nothing (addmm asks twice)."""

    def __init__(self, table: dict[str, list[dict[str, Any]]], table_sha256: str,
                 stats: LookupStats, device_key: str | None = None) -> None:
        super().__init__()
        self.table = table
        self.table_sha256 = table_sha256
        self.stats = stats
        self._device_key = device_key

    def uuid(self) -> str:  # noqa: D102
        return f"titan-rocm-gemm-lookup-{self.table_sha256}"

    def device_key(self, kernel_inputs: Any) -> str | None:
        """The device part of the key (``gcnArchName``); injectable for CPU tests."""
        return self._device_key or LookupTableChoices._get_device_key(kernel_inputs.device())

    def entries(self, kernel_inputs: Any, key: str) -> list[dict[str, Any]]:
        """The table's entries for a call: device-specific key first, then the bare key."""
        device = self.device_key(kernel_inputs)
        if device is not None and self.table.get(f"{device}+{key}"):
            return self.table[f"{device}+{key}"]
        return self.table.get(key) or []

    def choose(self, lowering, call, template_choices, kernel_inputs, templates, op_name,
               kwarg_overrides):  # noqa: D102
        entries = self.entries(kernel_inputs, call.key)
        fallback = self.first_fallback(lowering, template_choices, templates)
        if not entries:
            return fallback
        by_uid = {t.uid: t for t in templates}
        chosen = []
        for entry in entries:
            template = by_uid.get(entry["template_id"])
            if template is None:
                continue  # another call of this lowering offers it
            params = {k: v for k, v in entry.items() if k not in ("template_id", "template_hash")}
            src_hash = getattr(template, "src_hash", None)
            if entry.get("template_hash") and src_hash and entry["template_hash"] != src_hash:
                log_once(f"gemm_lookup-stale:{template.uid}", logging.WARNING,
                         "titan-rocm: gemm_lookup: the table's %s entries were tuned against "
                         "another version of the template's source; they are not used",
                         template.uid)
                continue
            base = next(iter(self.get_ktc(kernel_inputs, template, op_name)), None)
            if base is None:
                continue
            chosen.append(KernelTemplateChoice(
                template=base.template,
                params=DictKernelTemplateParams({**base.params.to_kwargs(), **params}),
                extra_kwargs=base.extra_kwargs, layout=base.layout, inputs=base.inputs))
        lowering.hit = lowering.hit or bool(chosen)
        return chosen[:1]

    def finish(self, lowering, problem, choices, input_nodes, layout):  # noqa: D102
        picked = [c for c in choices if any(ktc_of(c) is k for k in lowering.chosen)]
        self.stats.count(problem.key, lowering.hit)
        if not lowering.hit:
            log_once(f"gemm_lookup-miss:{problem.key}", logging.INFO,
                     "titan-rocm: gemm_lookup: miss for %s: ATen kernel, not autotuned",
                     problem.key)
        if picked:
            return picked[:1]
        if lowering.fallback is not None and lowering.fallback.choice is not None:
            return [lowering.fallback.choice]
        return choices[:1]


class ChoicesFactory:
    """``inductor_choices_class`` value: one handler per thread; the FX-graph cache keys on its
    ``uuid()``."""

    def __init__(self, make: Callable[[], GemmChoices]) -> None:
        self.make = make

    def __call__(self) -> GemmChoices:
        return self.make()


def install_lowering_hook() -> None:
    """Wrap ``AlgorithmSelectorCache.__call__`` once, so a handler with ``lowering_done`` settles
    each lowering's choices there."""
    patches.patch(AlgorithmSelectorCache, "__call__", _settling_lowerings, by=BY)


def _settling_lowerings(original: Callable[..., Any]) -> Callable[..., Any]:
    def __call__(self, name, choices, input_nodes, layout, *args, **kwargs):  # noqa: ANN001
        done = getattr(V.choices, "lowering_done", None)
        if done is not None:
            choices = done(name, list(choices), input_nodes, layout)
        return original(self, name, choices, input_nodes, layout, *args, **kwargs)

    return __call__


def install(factory: ChoicesFactory, settings: dict[str, Any] | None = None) -> None:
    """Make ``factory``'s handlers Inductor's in every thread until the patch scope lets go.

    Backward graphs are lowered eagerly, because torch 2.13's config is per thread and the autograd
    thread would not see these settings."""
    for name, value in (GEMM_SETTINGS if settings is None else settings).items():
        patches.setting(inductor_config, name, value, by=BY)
    patches.setting(inductor_config, "inductor_choices_class", factory, by=BY)
    # torch/_inductor/virtualized.py: V.choices is this thread's handler, kept on its
    # thread-local under the virtual's key; without one, Inductor builds one from
    # inductor_choices_class on first use (what is left after the teardown).
    from torch._inductor import virtualized

    patches.setting(virtualized.threadlocal, virtualized._choices._key, factory(), by=BY)
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        patches.setting(functorch_config, "force_non_lazy_backward_lowering", True, by=BY)
    install_lowering_hook()
    log.debug("titan-rocm: choices handler %s installed", factory().uuid())
