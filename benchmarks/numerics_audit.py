"""The stored GPU results of the whole-model numerics audit (schema 1), re-analysed.

    python -m benchmarks.numerics_audit --reanalyse \
        benchmarks/results/2026-12-01-h200/numerics-audit-2

These are the runs of the audit before it compared block by block
(``benchmarks/results/2026-12-01-h200/``: ``numerics-audit-1``, ``-2``, ``audit-table-*``):
``titan-rocm audit --json`` of llama3 1.5B, qwen3 1.7B and deepseek_v3 3.9B, a fault in
llama3's block 3, a few training steps, and the validated GEMM table against ATen-only. Their
figures stay reproducible here; the block-by-block audit's runs are
``benchmarks/audit_matrix.py``'s.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import quantile

SUMMARY_MARK = "TITAN_ROCM_CORRUPT_SUMMARY "
"""The line the audit worker printed at exit with the fault's counts."""


@dataclass(frozen=True)
class Model:
    """A job the runs audited: its config, and the block the fault went in (3 % of that
    block's first backward ``mul``)."""

    config: str
    corrupt_block: int = 1


MODELS: dict[str, Model] = {
    "llama3_1b": Model("configs/llama3_debug.toml", 3),  # --model.flavor bench_1B
    "qwen3_1.7b": Model("configs/qwen3_debug.toml", 3),  # --model.flavor 1.7B
    "deepseek_v3_4b": Model("configs/deepseek_v3_debug.toml", 1),  # bench_moe_4B, scope "moe"
    "deepseek_v3_fsdp2_ep2": Model("configs/deepseek_v3_debug.toml", 1),
    # The validated-tuning table's job (benchmarks/results/2026-11-30-h200-d/validated-tuning):
    # bench_1B, the whole 8 x 2048 micro-batch the table's GEMMs were tuned for.
    "llama3_1b_full": Model("configs/llama3_debug.toml", 3),
    "llama3_tp2": Model("configs/llama3_debug.toml", 1),
    "llama3_fsdp2": Model("configs/llama3_debug.toml", 1),
}


@dataclass(frozen=True)
class Case:
    """One stored run: an audit (``kind="audit"``) or training steps (``kind="train"``). Each
    log's first line is the run's whole command."""

    name: str
    model: str
    kind: str
    gpus: int = 1
    corrupt: bool = False
    steps: int = 1
    expect_exit: int = 0


def cases(ngpu: int) -> list[Case]:
    """The runs of a one-GPU (``ngpu=1``) or two-GPU call, most important first."""
    if ngpu == 1:
        return [
            Case("llama3_1b_audit", "llama3_1b", "audit"),
            Case("llama3_1b_audit_corrupt", "llama3_1b", "audit", corrupt=True, expect_exit=1),
            Case("llama3_1b_train", "llama3_1b", "train", steps=6),
            Case("qwen3_1.7b_audit", "qwen3_1.7b", "audit"),
            Case("deepseek_v3_4b_audit", "deepseek_v3_4b", "audit"),
            Case("qwen3_1.7b_train", "qwen3_1.7b", "train", steps=6),
            Case("deepseek_v3_4b_train", "deepseek_v3_4b", "train", steps=6),
            # The stored validated-tuning table against ATen-only, same job, same batch.
            Case("llama3_1b_full_audit_aten", "llama3_1b_full", "audit"),
            Case("llama3_1b_full_audit_table", "llama3_1b_full", "audit"),
        ]
    return [
        Case("deepseek_v3_fsdp2_ep2_audit", "deepseek_v3_fsdp2_ep2", "audit", gpus=2),
        Case("deepseek_v3_fsdp2_ep2_audit_corrupt", "deepseek_v3_fsdp2_ep2", "audit", gpus=2,
             corrupt=True, expect_exit=1),
        Case("llama3_tp2_audit", "llama3_tp2", "audit", gpus=2),
        Case("llama3_tp2_audit_corrupt", "llama3_tp2", "audit", gpus=2, corrupt=True,
             expect_exit=1),
        Case("llama3_fsdp2_train", "llama3_fsdp2", "train", gpus=2, steps=10),
        # With rocm.numerics_audit = first_step.
        Case("llama3_fsdp2_train_first_step_audit", "llama3_fsdp2", "train", gpus=2, steps=10),
    ]


# -- analysis -----------------------------------------------------------------------------------

_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:")


def rank_lines(text: str, rank: int = 0) -> list[str]:
    """The log's lines of ``rank`` (torchrun's ``[rankN]:`` prefix removed; unprefixed lines
    are kept: a one-process run has none)."""
    out = []
    for line in text.splitlines():
        m = _PREFIX.match(line)
        if m is None:
            out.append(line)
        elif int(m.group(1)) == rank:
            out.append(line[m.end():])
    return out


def audit_result(text: str) -> dict[str, Any] | None:
    """The last ``--json`` object (``"schema"`` first) rank 0 printed, or None."""
    joined = "\n".join(rank_lines(text))
    decoder = json.JSONDecoder()
    found = None
    # The object opens with a line "{" (indent=2), or '{"schema"' on one line; a log line
    # can land right after the "{" (seen on the H200), so every "{" line is tried.
    for m in re.finditer(r'(?m)^\{\s*$|\{\s*"schema"', joined):
        got = _decode_around_foreign_lines(decoder, joined, m.start())
        if got is not None and "schema" in got:
            found = got
    return found


def _decode_around_foreign_lines(decoder: json.JSONDecoder, text: str, start: int,
                                 tries: int = 64) -> dict[str, Any] | None:
    """The JSON object at ``start``, leaving out whole lines that break it: torchrun's
    ``--tee`` tails the worker's stdout and stderr files separately, so a log line written to
    stderr while the object was printed can land between two of its lines (seen on the H200:
    the fault's at-exit line inside the corrupted audit's JSON)."""
    for _ in range(tries):
        try:
            found, _ = decoder.raw_decode(text, start)
            return found if isinstance(found, dict) else None
        except ValueError as error:
            pos = getattr(error, "pos", None)
            if pos is None:
                return None
            begin = text.rfind("\n", 0, pos) + 1
            end = text.find("\n", pos)
            if begin <= start or end < 0:
                return None
            text = text[:begin] + text[end + 1:]
    return None


def corrupt_summary(text: str) -> dict[str, Any] | None:
    """The fault's counts the audit worker printed at exit (rank 0), or None."""
    for line in reversed(rank_lines(text)):
        if line.startswith(SUMMARY_MARK):
            return json.loads(line[len(SUMMARY_MARK):])
    return None


def ratio_distribution(result: dict[str, Any]) -> dict[str, Any]:
    """err_job / err_eager over the audit's parameters: median, p99, max, and the worst."""
    rows = [p for p in result.get("parameters") or [] if p.get("ratio") is not None]
    ratios = [float(p["ratio"]) for p in rows]
    if not ratios:
        return {"parameters": 0}
    worst = max(rows, key=lambda p: float(p["ratio"]))
    return {"parameters": len(ratios), "median": statistics.median(ratios),
            "p99": quantile(ratios, 0.99), "max": max(ratios), "worst": worst["name"],
            "flagged": sum(1 for p in rows if p.get("flagged"))}


def flagged_blocks(result: dict[str, Any]) -> list[str]:
    """The blocks with a flagged parameter, worst first (the audit names them ``layers.N``;
    ``(outside blocks)`` gathers the embedding, final norm and output)."""
    blocks = [b for b in result.get("blocks") or [] if b.get("flagged")]
    blocks.sort(key=lambda b: -float(b.get("worst_ratio") or 0.0))
    return [str(b["block"]) for b in blocks]


def block_id(name: Any) -> int | None:
    """``layers.3`` / ``3`` -> 3; None for ``(outside blocks)`` or nothing."""
    m = re.fullmatch(r"(?:.*\.)?(\d+)", str(name)) if name is not None else None
    return int(m.group(1)) if m else None


def judge_corrupt(result: dict[str, Any] | None, expected_block: int) -> dict[str, Any]:
    """Was the fault flagged, and did the audit name its block as the origin?

    A fault on the path of block k's input gradient reaches every block before k (their
    backward runs after k's) and the embedding, as a wrong kernel's output would; nothing
    reaches the blocks after k. So the audit is right when it flags, names block k as the
    origin (its ``origin``: the first wrong block in backward order; the worst flagged block
    where it gives none), and flags no block after k.
    """
    if result is None:
        return {"flagged": False, "reason": "no audit JSON in the log"}
    blocks = flagged_blocks(result)
    ids = [i for i in map(block_id, blocks) if i is not None]
    origin = result.get("origin") or (blocks[0] if blocks else None)
    return {
        "verdict": result.get("verdict"), "flagged": result.get("verdict") == "flagged",
        "origin": origin, "origin_is_right": block_id(origin) == expected_block,
        "flagged_blocks": blocks, "worst_is_right": bool(ids) and ids[0] == expected_block,
        "later_blocks_clean": not any(i > expected_block for i in ids),
        "only_that_block": ids == [expected_block],
        "upstream_flagged": sorted(i for i in ids if i < expected_block),
        "flagged_parameters": [p["name"] for p in result.get("parameters") or []
                               if p.get("flagged")],
    }


def train_figures(text: str, tokens_per_step: int | None) -> dict[str, Any]:
    """Losses by step, median step time (steps >= 2, from tokens/s), peak memory, and the
    seconds from "Training starts" to step 1 (where an in-training audit runs), rank 0."""
    from titan_rocm.logs.parse import parse_text

    parsed = parse_text(text)
    records = [r for r in parsed.train_records if r.rank in (None, 0)]
    losses = {r.step: r.loss for r in records}
    tps = [r.tps for r in records if r.step >= 2 and r.tps]
    step_s = tokens_per_step / statistics.median(tps) if tps and tokens_per_step else None
    memory = max((r.memory_gib or 0.0 for r in records), default=None)
    lines = rank_lines(text)
    starts = [harness.stamp(x) for x in lines if "Training starts at step" in x]
    first = [harness.stamp(x) for x in lines if re.search(r"\bstep:\s*1\b", x)]
    to_step1 = (round(first[0] - starts[0], 1)
                if starts and first and None not in (starts[0], first[0]) else None)
    return {"loss": losses, "step_s": step_s, "tokens_per_step": tokens_per_step,
            "to_step1_s": to_step1,
            "memory_gib": memory if memory else None, "steps": sorted(losses)}


def analyse(case: Case, raw: dict[str, Any]) -> dict[str, Any]:
    """One run's figures from its log."""
    text = Path(raw["log"]).read_text(errors="replace")
    out: dict[str, Any] = {"name": case.name, "exit": raw.get("exit"),
                           "wall_s": raw.get("wall_s"), "expect_exit": case.expect_exit}
    if case.kind == "train":
        out.update(train_figures(text, harness.tokens_per_step(MODELS[case.model].config)))
        return out
    result = audit_result(text)
    out["audit"] = None if result is None else {
        k: result.get(k) for k in ("verdict", "exit_code", "error", "world_size", "tokens",
                                   "reference_dtype", "job_dtype", "loss", "blocks", "time_s",
                                   "peak_memory_bytes", "chunks", "notes")}
    if result is not None:
        out["err_job"] = {p["name"]: p.get("err_job") for p in result.get("parameters") or []}
    out["ratios"] = ratio_distribution(result) if result else None
    out["fault"] = corrupt_summary(text)
    if case.corrupt:
        out["corrupt"] = judge_corrupt(result, MODELS[case.model].corrupt_block)
    return out


def figures(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the issue asks: clean ratio distributions, the fault's verdicts, the costs."""
    by_case = {c.name: c for n in (1, 2) for c in cases(n)}
    clean, faults, cost = {}, {}, {}
    for name, res in results.items():
        case = by_case.get(name)
        if case is None or case.kind != "audit":
            continue
        if case.corrupt:
            faults[name] = {**(res.get("corrupt") or {}), "exit": res.get("exit"),
                            "hits": (res.get("fault") or {}).get("hits")}
        else:
            clean[name] = {**(res.get("ratios") or {}), "exit": res.get("exit"),
                           "verdict": (res.get("audit") or {}).get("verdict")}
        train = results.get(f"{case.model}_train")
        audit = res.get("audit") or {}
        if not case.corrupt and train:
            total = (audit.get("time_s") or {}).get("total")
            peak = audit.get("peak_memory_bytes")
            step_s, mem = train.get("step_s"), train.get("memory_gib")
            cost[case.model] = {
                "audit_tokens": audit.get("tokens"), "train_tokens": train.get("tokens_per_step"),
                "audit_s": total, "train_step_s": step_s,
                "audit_over_step": round(total / step_s, 1) if total and step_s else None,
                "audit_peak_gib": round(peak / 2**30, 2) if peak else None,
                "train_peak_gib": mem,
                "peak_ratio": round(peak / 2**30 / mem, 2) if peak and mem else None,
            }
    out: dict[str, Any] = {"clean": clean, "corrupt": faults, "cost": cost,
                           "false_positives": sum(1 for c in clean.values()
                                                  if c.get("verdict") != "ok")}
    aten, table = (results.get(f"llama3_1b_full_audit_{k}") for k in ("aten", "table"))
    if aten and table:
        out["table_vs_aten"] = table_figures(aten, table)
    plain = results.get("llama3_fsdp2_train")
    audited = results.get("llama3_fsdp2_train_first_step_audit")
    if plain and audited:
        out["first_step"] = first_step_figures(plain, audited)
    return out


def table_figures(aten: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """The validated-tuning table's audit against ATen-only's, same job, same micro-batch:
    each parameter's err_job (against the same float64 reference) with the table over without
    it, and both losses' errors. Above 1: the table's GEMMs move that gradient further from
    float64 than ATen's do."""
    a, t = aten.get("err_job") or {}, table.get("err_job") or {}
    pairs = {n: (float(t[n]), float(a[n])) for n in sorted(set(a) & set(t))
             if isinstance(t[n], (int, float)) and isinstance(a[n], (int, float)) and a[n] > 0}
    ratios = {n: tv / av for n, (tv, av) in pairs.items()}
    loss = {k: ((r.get("audit") or {}).get("loss") or {}).get("err_job")
            for k, r in (("aten", aten), ("table", table))}
    verdicts = {k: (r.get("audit") or {}).get("verdict") for k, r in (("aten", aten),
                                                                      ("table", table))}
    if not ratios:
        return {"parameters": 0, "loss_err_job": loss, "verdicts": verdicts}
    worst = max(ratios, key=ratios.__getitem__)
    values = list(ratios.values())
    return {"parameters": len(values), "median": statistics.median(values),
            "p99": quantile(values, 0.99), "max": max(values), "min": min(values),
            "worst": worst, "loss_err_job": loss, "verdicts": verdicts}


def first_step_figures(plain: dict[str, Any], audited: dict[str, Any]) -> dict[str, Any]:
    """The in-training audit: the later steps' losses against the run without it, and cost."""
    a, b = plain.get("loss") or {}, audited.get("loss") or {}
    steps = sorted(set(a) & set(b))
    return {"steps_compared": steps, "losses_equal": bool(steps) and all(
        a[s] == b[s] for s in steps), "differing_steps": [s for s in steps if a[s] != b[s]],
        "wall_s_extra": (round(audited["wall_s"] - plain["wall_s"], 1)
                         if audited.get("wall_s") and plain.get("wall_s") else None),
        "to_step1_s_extra": (round(audited["to_step1_s"] - plain["to_step1_s"], 1)
                             if None not in (audited.get("to_step1_s"), plain.get("to_step1_s"))
                             else None),
        "train_step_s": plain.get("step_s")}


# -- the stored results ---------------------------------------------------------------------------

def reanalyse(directory: Path) -> dict[str, Any]:
    """Every figure again from a stored result (summary.json + logs.tar.gz), on any machine."""
    by_case = {c.name: c for n in (1, 2) for c in cases(n)}
    with harness.open_stored(directory) as (stored, logs):
        results = {}
        for name, run in stored.get("runs", {}).items():
            if name not in by_case or str(run.get("exit")).startswith("skipped"):
                continue
            raw = {"log": str(logs / f"{name}.log"), "exit": run.get("exit"),
                   "wall_s": run.get("wall_s")}
            results[name] = analyse(by_case[name], raw)
    return {"environment": stored.get("environment"), "figures": figures(results),
            "runs": results}


def main(argv: list[str] | None = None) -> int:
    """Reanalyse a stored result."""
    parser = harness.parser(__doc__, runs=False)
    args = parser.parse_args(argv)
    if not args.reanalyse:
        parser.error("--reanalyse DIR is required")
    return harness.print_reanalysis(parser, reanalyse, args.reanalyse)


if __name__ == "__main__":
    sys.exit(main())
