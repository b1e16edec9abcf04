"""``titan-rocm plan``'s text: the answer first, then the evidence (docs/plan.md)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from typing import Any

from titan_rocm.measured import FIGURES, cost_of
from titan_rocm.settings import RocmSettings
from titan_rocm.workarounds.registry import workaround_class

PLAN_SCHEMA = 1
"""Raised when a field changes (both TorchTitan versions)."""

NOT_SIMULATED = (
    "the GPU itself, NCCL/RCCL, memory, the tokenizer and dataset paths, and the kernels "
    "Triton compiles (triton_war scans them as they compile)"
)
"""What no plan can simulate on a login node (docs/plan.md, "Not checked")."""

INTERNAL_KEYS = frozenset({
    "worker_reach", "buffer_ops_knob", "dry_run", "patched", "bound_in", "observes",
    "op_sac_save_list", "guard", "guard_not_covered", "accepted", "release_facts",
    "get_gfx_source", "get_gfx_matches_device", "in_cache_key", "checked_at",
})


def value_text(value: Any) -> str:
    """One value in the plan's one style: a string bare, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")


def collapse(items: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Runs of consecutive numbered keys with one value become one range (``layers.1–2.moe``)."""
    out: list[tuple[str, str]] = []
    run: tuple[str, int, int, str, str] | None = None  # prefix, first, last, suffix, value

    def flush() -> None:
        if run is not None:
            prefix, first, last, suffix, value = run
            span = str(first) if first == last else f"{first}–{last}"
            out.append((f"{prefix}{span}{suffix}", value))

    for key, value in items:
        m = _NUMBERED.match(key)
        if m is None:
            flush()
            run = None
            out.append((key, value))
            continue
        prefix, number, suffix = m.group(1), int(m.group(2)), m.group(3)
        if run is not None and (run[0], run[3], run[4]) == (prefix, suffix, value) \
                and number == run[2] + 1:
            run = (prefix, run[1], number, suffix, value)
            continue
        flush()
        run = (prefix, number, number, suffix, value)
    flush()
    return out


def _details_lines(details: dict[str, Any], indent: str, verbose: bool) -> list[str]:
    lines = []
    for key, value in details.items():
        if key == "blocks" or (key in INTERNAL_KEYS and not verbose):
            continue  # blocks: shown in the compile section
        if isinstance(value, dict) and value:
            lines.append(f"{indent}{key}:")
            shown = [(str(k), value_text(v)) for k, v in value.items()
                     if verbose or k not in INTERNAL_KEYS]
            lines += [f"{indent}  {k}: {v}" for k, v in collapse(shown)]
        else:
            lines.append(f"{indent}{key}: {value_text(value)}")
    return lines


def _cost(d: dict[str, Any], converters: list[str], sources: list[str]) -> str:
    figure = cost_of(d["workaround"], d["details"], converters)
    not_measured = workaround_class(d["workaround"]).not_measured
    if figure is None and not_measured:
        return not_measured
    if figure is None:
        together = FIGURES["dense.all_on"]
        source = f"every workaround forced on together: {together.sentence()}"
        text = "not measured alone"
    else:
        source = f"{figure.model}, {figure.gpu}: {figure.benchmark}, {figure.folder}"
        text = f"{figure.ratio:g} x {figure.what} tokens/s"
    if source not in sources:
        sources.append(source)
    return f"{text} [{sources.index(source) + 1}]"


def verdict_lines(plan: dict[str, Any]) -> list[str]:
    """The opening block: what changes in this run and what it costs, what was not simulated."""
    m = plan["model"]
    world = plan.get("world_size")
    where = plan["platform"].get("arch") or "this machine"
    if plan["platform"].get("simulated"):
        where += ", simulated"
    if world:
        where += f"; {world['size']} rank(s), {world['source']}"
    lines = [f"verdict: the job starts ({m['name']} {m['flavor']} on {where})"]
    applied = [d for d in plan["workarounds"] if d["applied"]]
    # A workaround listed twice (``rocm`` and ``rocm.<name>``) applies once; its second
    # listing's skip is not "left as stock".
    skipped = [d for d in plan["workarounds"] if not d["applied"]
               and d["workaround"] not in {a["workaround"] for a in applied}]
    sources: list[str] = []
    if not plan["titan_rocm_listed"]:
        lines.append("titan-rocm changes nothing in this run: " + plan.get(
            "not_listed_advice",
            "it is not listed: add \"rocm\" to [model] converters (or pass "
            "--model.converters rocm) to apply its workarounds"))
    elif not applied:
        lines.append("titan-rocm changes nothing in this run: every workaround skips")
    else:
        lines.append(f"titan-rocm changes {len(applied)} thing(s) in this run:")
        for d in applied:
            what = workaround_class(d["workaround"]).plan_line(d["details"])
            lines.append(f"  rocm.{d['workaround']}: {what}")
            lines.append(f"      cost: {_cost(d, plan['converters'], sources)}")
        lines += [f"  [{i}] {source}" for i, source in enumerate(sources, start=1)]
    if skipped and plan["titan_rocm_listed"]:
        lines.append("left as stock: " + "; ".join(
            f"rocm.{d['workaround']} ({d['reason']})" for d in skipped))
    not_simulated = NOT_SIMULATED
    others = plan.get("other_converters") or []
    if others:
        not_simulated += "; TorchTitan's converters " + ", ".join(others) + \
            " (applied by TorchTitan at start-up)"
    for check in plan.get("not_checked") or []:
        not_simulated += f"; {check}"
    lines.append(f"not simulated: {not_simulated}")
    return lines


def _settings_lines(settings: dict[str, Any], verbose: bool) -> list[str]:
    defaults = dataclasses.asdict(RocmSettings())
    changed = {k: v for k, v in settings.items() if defaults.get(k, object()) != v}
    if verbose:
        return ["settings in force ([rocm]):"] + [
            f"  {k} = {json.dumps(v)}" for k, v in settings.items()]
    if not changed:
        return ["settings: every [rocm] setting at its default (--verbose lists them)"]
    return ["settings that differ from the defaults ([rocm]; --verbose lists all):"] + [
        f"  {k} = {json.dumps(v)}" for k, v in changed.items()]


def format_plan(plan: dict[str, Any], verbose: bool = False) -> str:
    """The plan as text for people: the verdict first."""
    lines = verdict_lines(plan)
    lines.append("")
    m = plan["model"]
    lines += [
        f"job:      {plan['config_file'] or '(no TOML; flags and defaults)'}",
        f"model:    {m['name']} {m['flavor']}: {m['blocks']} blocks, {m['moe_blocks']} MoE",
        f"platform: {plan['platform']['summary']}",
    ]
    world = plan.get("world_size")
    if world:
        lines.append(f"world:    {world['size']} rank(s), {world['source']}: {world['detail']}")
    if "launcher" in plan:
        lines.append(f"launcher: {plan['launcher']}")
    lines.append(f"converters: {', '.join(plan['converters']) or '(none)'}")
    for name in plan["other_converters"]:
        lines.append(f"  {name}: TorchTitan converter, applied by TorchTitan (not simulated here)")
    if plan["titan_rocm_listed"] or verbose:
        lines.append("")
        lines.append("workarounds:")
        for d in plan["workarounds"]:
            status = "applied" if d["applied"] else f"skipped: {d['reason']}"
            lines.append(f"  rocm.{d['workaround']:<18} {status}   [{d['converter']}]")
            lines += _details_lines(d["details"], "      ", verbose)
    lines.append("")
    comp = plan["compile"]
    if not comp["enabled"]:
        lines.append("compile: the model is not compiled ([compile] enable = false, or \"model\" "
                     "not in [compile] components): every block runs eager")
    else:
        lines.append("compile, per TransformerBlock:")
        lines += [f"  layers.{k}: {v}" for k, v in collapse(comp["blocks"].items())]
        if comp.get("summary"):
            lines.append(f"  summary: {comp['summary']}")
    if plan["titan_rocm_listed"] or verbose:
        lines.append("")
        lines += _settings_lines(plan["settings"], verbose)
    return "\n".join(lines)
