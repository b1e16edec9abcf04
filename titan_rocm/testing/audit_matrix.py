"""The audit's detection matrix on one built trainer: clean runs over seeds, then the test fault
at each fraction, direction and block, switched at run time so the model compiles once.

A fault is **named** when the audit flags it and its first-wrong segment in the fault's
direction is its block; a backward fault must also leave the forward clean."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from titan_rocm.testing import corrupt

FRACTIONS = (0.005, 0.01, 0.03)
GRAPHS = ("forward", "backward")


def first_middle_last(keys: Sequence[str]) -> list[str]:
    """The first, a middle and the last block key (fewer when the model has fewer)."""
    picked = [keys[0], keys[len(keys) // 2], keys[-1]]
    return list(dict.fromkeys(picked))


def fault_specs(blocks: Sequence[str], fractions: Sequence[float] = FRACTIONS,
                graphs: Sequence[str] = GRAPHS, op: str = "mul",
                index: int = 0) -> list[corrupt.CorruptSpec]:
    return [corrupt.CorruptSpec(block=int(b), graph=g, op=op, index=index, fraction=f)
            for b in blocks for g in graphs for f in fractions]


def install(model_parts: list[Any], op: str = "mul", index: int = 0,
            module: str | None = None) -> None:
    """The fault's op in the forward and backward graphs, inactive (before the first compile)."""
    blocks = [key for part in model_parts for key, _ in part.layers.named_children()]
    corrupt.install(model_parts, corrupt.CorruptSpec(block=int(blocks[0]), op=op,
                                                     index=index, module=module),
                    graphs=GRAPHS)
    corrupt.switch(None)


@dataclass(frozen=True)
class Site:
    """Where inside a block a fault goes: the ``index``-th ``aten.<op>`` traced inside child
    ``module`` (the post-grad graph's order)."""

    module: str
    op: str
    index: int
    what: str

    def specs(self, blocks: Sequence[str], fraction: float = 0.005,
              graphs: Sequence[str] = GRAPHS) -> list[corrupt.CorruptSpec]:
        """This site in each of ``blocks``, in each direction."""
        return [corrupt.CorruptSpec(block=int(b), graph=g, module=self.module, op=self.op,
                                    index=self.index, fraction=fraction)
                for b in blocks for g in graphs]


SITES: dict[str, tuple[Site, ...]] = {
    # TorchTitan 0.2.2's Attention: wq, wk, wv, wo are its mm in order; its rotary embedding
    # multiplies complex numbers, q's then k's (the stored GPU grids hold indices 0 to 4 of
    # this list as they were run; q's multiply came last).
    "llama3": (Site("attention", "mul", 1, "the rotary multiply of k"),
               Site("attention", "mm", 3, "the output projection"),
               Site("attention_norm", "mul", 0, "the attention norm"),
               Site("ffn_norm", "mul", 0, "the feed-forward norm"),
               Site("feed_forward", "mul", 0, "the SwiGLU multiply"),
               Site("attention", "mul", 0, "the rotary multiply of q")),
    "qwen3": (Site("attention", "mul", 0, "the q/k norm or rotary multiply"),
              Site("attention", "mm", 3, "the output projection"),
              Site("attention_norm", "mul", 0, "the attention norm"),
              Site("feed_forward", "mul", 0, "the SwiGLU multiply")),
}
"""The sites the CPU sub-module matrix proves, per model (tests/support/audit_trainer.py)."""


def judge(result: dict[str, Any], spec: corrupt.CorruptSpec | None) -> dict[str, Any]:
    """Whether ``result`` is right for ``spec`` (None: a clean run, which must be ok)."""
    first = result.get("first_wrong") or {}
    flagged = result.get("verdict") == "flagged"
    if spec is None:
        return {"right": result.get("verdict") == "ok", "flagged": flagged}
    named = first.get(spec.graph) == spec.key
    if spec.module is not None:  # inside a block: its child named too
        module = (result.get("first_wrong_module") or {}).get(spec.graph)
        named = named and module == spec.module.split(".")[0]
    clean_forward = spec.graph == "forward" or first.get("forward") is None
    return {"right": flagged and named and clean_forward, "flagged": flagged,
            "named": named, "forward_clean": clean_forward, "first_wrong": first,
            "first_wrong_module": result.get("first_wrong_module")}


@dataclass
class Outcome:
    """One audit of the matrix."""

    spec: dict[str, Any] | None
    seed: int | None
    verdict: str
    judged: dict[str, Any]
    hits: dict[str, int]
    seconds: float
    result: dict[str, Any] = field(repr=False)

    def to_dict(self, keep_result: bool = False) -> dict[str, Any]:
        """JSON-ready (the audit's own object only when asked: it is large)."""
        out = {"spec": self.spec, "seed": self.seed, "verdict": self.verdict,
               "judged": self.judged, "hits": self.hits, "seconds": round(self.seconds, 3)}
        if keep_result:
            out["result"] = self.result
        return out


def run(audit: Callable[[], dict[str, Any]], specs: Sequence[corrupt.CorruptSpec],
        seeds: Sequence[int], reseed: Callable[[int], None],
        on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Clean audits for each seed (``reseed(seed)``: new weights and batch), then one audit per
    fault, each judged."""
    outcomes = []

    def one(spec: corrupt.CorruptSpec | None, seed: int | None) -> None:
        corrupt.switch(spec)
        t0 = time.perf_counter()
        result = audit()
        hits = dict(corrupt.summary()["hits"])
        outcome = Outcome(None if spec is None else spec.to_dict(), seed, result["verdict"],
                          judge(result, spec), hits, time.perf_counter() - t0, result)
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    for seed in seeds:
        reseed(seed)
        one(None, seed)
    if seeds:
        reseed(seeds[0])
    for spec in specs:
        one(spec, None)
    corrupt.switch(None)
    return outcomes
