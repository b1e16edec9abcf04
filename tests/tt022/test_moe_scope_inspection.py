"""Proof by inspection: under ``moe_eager_scope = "moe"`` no compiled graph holds an FSDP hook,
a collective, or the router / token permutation / grouped GEMM of an MoE block.

``tests/support/moe_scope_worker.py`` runs on two gloo ranks: TorchTitan 0.2.2's real deepseek_v3
(one dense block, one MoE block) through its own ``parallelize_fn`` with FSDP over both ranks
and EP = 2 (experts' dispatch/combine by ``distribute_module``, ``fully_shard`` per block and
on the experts), compiled with a backend that records every graph Dynamo makes. Inductor
compiles exactly those graphs, so what is not in them is not in any Inductor graph.

Positive controls, in the same run: TorchTitan's stock MoE compile, whose router, permutation
and grouped-GEMM graphs the audit must flag, and a compiled functional all-gather, which it
must flag as a collective. Numerics: every case's loss and gradients equal the same FSDP + EP
model run without compile (FP32; graphs run through AOTAutograd with eager kernels).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.cpu_support import free_port

REPO = Path(__file__).resolve().parents[2]
SCOPES = ("moe_scope", "moe_scope_ac_full", "block_scope")
SPLIT = "attention, attention_norm, ffn_norm fullgraph; moe eager"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("moe_scope")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(free_port()),
           str(REPO / "tests" / "support" / "moe_scope_worker.py"), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540, cwd=out)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _moe_params(graph: dict[str, Any]) -> list[str]:
    return [name for name in graph["reads"] if ".moe." in name]


@pytest.mark.slow
@pytest.mark.parametrize("case", SCOPES)
def test_no_graph_holds_fsdp_collectives_or_moe_routing(ranks, case) -> None:
    for rank in ranks:
        result = rank[case]
        assert result["graphs"], case  # something was compiled: block 0 at least
        for graph in result["graphs"]:
            assert graph["clean"], (case, rank["rank"], graph)
            assert not _moe_params(graph), (case, graph["reads"])  # shared experts too


@pytest.mark.slow
def test_moe_scope_compiles_attention_and_norms_of_the_moe_block(ranks) -> None:
    for rank in ranks:
        for case in ("moe_scope", "moe_scope_ac_full"):
            result = rank[case]
            assert result["plan"] == {"0": "fullgraph", "1": SPLIT}
            read = {name for graph in result["graphs"] for name in graph["reads"]}
            assert {"layers.1.attention.wq.weight", "layers.1.attention_norm.weight"} <= read
            assert result["eager_forwards"] == {"1": 1}  # the MoE module, once (AC recompute not)
            assert result["runner_compiled"] is False  # experts eager under this scope too
            assert result["experts_compile"].startswith(
                "eager: rocm.moe_eager_compile keeps each MoE module eager"), result
        block = rank["block_scope"]
        assert block["plan"] == {"0": "fullgraph", "1": "eager (MoE)"}
        assert not any(name.startswith("layers.1.") for g in block["graphs"] for name in g["reads"])


@pytest.mark.slow
@pytest.mark.parametrize("case", [*SCOPES, "stock_moe_compile"])
def test_loss_and_gradients_match_the_same_model_without_compile(ranks, case) -> None:
    for rank in ranks:
        result = rank[case]
        assert result["loss"] == pytest.approx(result["eager_loss"], rel=1e-6)
        assert result["grads_compared"] > 20
        assert result["grads_mismatched_vs_eager"] == [], result["grad_max_abs_diff_vs_eager"]
        # The FSDP + EP model is the unsharded model (EP sums expert gradients in another
        # order: a few 1e-6 apart, compiled or not).
        assert result["loss"] == pytest.approx(result["ref_loss"], rel=1e-6)
        assert result["grad_max_abs_diff_vs_reference"] < 1e-5


@pytest.mark.slow
def test_the_audit_sees_what_stock_moe_compile_and_a_collective_put_in_graphs(ranks) -> None:
    """Positive controls: the same audit flags real MoE routing and a real collective."""
    for rank in ranks:
        stock = rank["stock_moe_compile"]["graphs"]
        flagged = " ".join(op for g in stock for op in g["moe"])
        for op in ("topk", "histc", "argsort", "_grouped_mm"):  # router, permutation, GEMM
            assert op in flagged, (op, flagged)
        assert any(_moe_params(g) for g in stock)  # the shared experts, by parameter
        control = rank["control_collective"]["graphs"]
        assert len(control) == 1 and not control[0]["clean"]
        assert "_c10d_functional.all_gather_into_tensor" in control[0]["collectives"]


# -- the audit on its own (one process, fast) -------------------------------------------------


def _graphs_of(fn: Any, *args: Any) -> list[Any]:
    import torch

    graphs: list[Any] = []

    def keep(gm: Any, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=keep, fullgraph=True)(*args)
    return graphs


def test_audit_reads_ops_and_the_bodies_of_higher_order_ops() -> None:
    import torch
    from torch.utils.checkpoint import checkpoint

    from titan_rocm.testing.graph_audit import audit

    x = torch.randn(4, 8, requires_grad=True)
    [plain] = _graphs_of(lambda t: sum(torch.broadcast_tensors(t, t[:1])).relu(), x)
    assert audit(plain).clean  # broadcasting is arithmetic, not a collective

    def routed(t: torch.Tensor) -> torch.Tensor:
        return torch.topk(t, 2).values.sum() + torch.argsort(t[0]).sum()

    [router] = _graphs_of(routed, x)
    assert {"torch._VariableFunctionsClass.topk",
            "torch._VariableFunctionsClass.argsort"} <= set(audit(router).moe)

    # Inside a checkpointed region Dynamo puts the body in a subgraph: read it too.
    def hidden(t: torch.Tensor) -> torch.Tensor:
        return checkpoint(lambda u: torch.topk(u, 2).values.tanh(), t, use_reentrant=False)

    [outer] = _graphs_of(hidden, x)
    result = audit(outer)
    assert not result.clean and "torch._VariableFunctionsClass.topk" in result.moe
    assert result.to_dict()["clean"] is False
