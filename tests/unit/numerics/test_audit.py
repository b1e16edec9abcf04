"""The block-by-block audit (docs/numerics-audit.md) on TorchTitan 0.2.2's real trainer on CPU
(tests/support/audit_trainer.py: CpuTrainer parallelised and compiled by the model's own
parallelize_fn), through the API, ``titan-rocm audit`` and ``rocm.numerics_audit`` inside
``Trainer.train()``; the driver's memory plan and retries on a toy model."""

from __future__ import annotations

import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.cpu_support import free_port

TESTS = Path(__file__).resolve().parents[2]
ROOT = TESTS.parent


# -- the driver on a toy model -------------------------------------------------------------


class _Toy:
    """A TorchTitan-shaped model (embedding, ``layers``, norm, output), TorchTitan's loss (each
    token's loss summed, over a token count fixed before the passes), run eager: the job pass
    is eager too, so the job equals the eager replay."""

    def __init__(self, rows: int = 4, tied: bool = False) -> None:
        torch.manual_seed(0)
        model = torch.nn.Module()
        model.tok_embeddings = torch.nn.Embedding(16, 8)
        model.layers = torch.nn.ModuleDict(
            {str(i): torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
             for i in range(3)})
        model.norm = torch.nn.LayerNorm(8)
        model.output = torch.nn.Linear(8, 16, bias=False)
        if tied:
            model.output.weight = model.tok_embeddings.weight
        self.model = model
        self.inputs = {"input": torch.randint(0, 16, (rows, 5))}
        self.labels = torch.randint(0, 16, (rows, 5))
        self.denominator = self.labels.numel()
        self.calls = 0

    def forward(self, input_dict: dict[str, Any], labels: Any) -> Any:
        self.calls += 1
        m = self.model
        h = m.tok_embeddings(input_dict["input"])
        for block in m.layers.values():
            h = h + block(h)
        logits = m.output(m.norm(h)).float()
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), reduction="sum") / self.denominator

    def run(self, input_dict: dict[str, Any], labels: Any) -> Any:
        loss = self.forward(input_dict, labels)
        loss.backward()
        return loss

    def reference(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def audit(self, chunks: int | None = None, **kw: Any) -> Any:
        from titan_rocm.numerics.audit import audit_micro_batch
        from titan_rocm.numerics.stats import AuditSettings

        return audit_micro_batch([self.model], torch.device("cpu"), lambda labels: self,
                                 self.inputs, self.labels, AuditSettings(), chunks=chunks, **kw)


def test_a_clean_toy_is_ok_in_every_segment_with_a_tied_weight() -> None:
    """Every segment compared (embedding output, each block's output and input gradient and
    parameters, the head's input gradient and loss, the end-to-end loss); a weight tied
    between the embedding and the output projection is reported once, under the embedding,
    its gradient from both ends (eager job: every error equals eager's)."""
    r = _Toy(tied=True).audit()
    d = r.to_dict()
    assert d["verdict"] == "ok", [t for t in d["tensors"] if t["flagged"]]
    names = {t["name"]: t for t in d["tensors"]}
    assert {"embedding output", "layers.1 output", "layers.1 input grad",
            "layers.1.0.weight", "head input grad", "tok_embeddings.weight", "norm.weight",
            "head loss (teacher-forced)"} <= set(names)
    assert "output.weight" not in names  # the tied weight: named once
    assert names["tok_embeddings.weight"]["segment"] == "embedding"
    assert names["norm.weight"]["segment"] == "head"
    assert [s["segment"] for s in d["segments"]] == ["embedding", "0", "1", "2", "head"]
    for t in d["tensors"]:
        if t["kind"] != "loss":
            assert t["err_job"] == t["err_eager"], t  # the job ran eager: the same numbers
    assert d["reference"] == "float64" and d["job_dtype"] == "float32"
    assert d["loss"]["job"] == pytest.approx(d["loss"]["reference"], rel=1e-5)


def test_runs_of_rows_give_the_whole_micro_batchs_numbers() -> None:
    """Replays in 3 runs of rows (5 rows: 2, 1, 2): the same errors, losses and verdicts as
    whole (float64 reference: to rounding); more runs than rows is refused, naming both."""
    from titan_rocm.numerics.result import AuditError
    from titan_rocm.numerics.rows import row_bounds

    whole = _Toy(rows=5).audit().to_dict()
    split = _Toy(rows=5).audit(chunks=3).to_dict()
    assert split["chunks"] == 3 and whole["chunks"] == 1
    for a, b in zip(split["tensors"], whole["tensors"], strict=True):
        assert a["name"] == b["name"]
        # A loss is a float32 sum: another order of the runs moves it by a float32 ulp.
        tolerance = 2e-7 if a["kind"] == "loss" else 1e-15
        assert a["err_job"] == pytest.approx(b["err_job"], rel=1e-6, abs=tolerance), a["name"]
    # The loss casts the logits to float32 (as TorchTitan's does): float32 rounding.
    assert split["loss"]["reference"] == pytest.approx(whole["loss"]["reference"], rel=1e-6)
    assert row_bounds(8, 3) == [(0, 3), (3, 5), (5, 8)]
    with pytest.raises(AuditError, match=r"^--reference-chunks 6 is not valid; accepted: an "
                                         r"integer >= 1 and <= 5 \(the micro-batch's rows\)$"):
        _Toy(rows=5).audit(chunks=6)


def test_a_replay_out_of_memory_runs_again_in_more_runs_of_rows(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """In one process a replay that runs out of memory runs again in twice as many runs of
    rows (down to one row); the result says so, and its numbers are the whole batch's. The
    log line is not torch's wording ("CUDA out of memory": check-log's crash pattern)."""
    from titan_rocm.logs.parse import _CRASH_KINDS
    from titan_rocm.numerics import audit_run, replay, state

    whole = _Toy().audit().to_dict()
    real = replay.replay_block
    calls: list[tuple[int, int, Any]] = []

    def failing(record: Any, lo: int, hi: int, dtype: Any) -> Any:
        calls.append((lo, hi, dtype))
        if record.key == "0" and dtype is not None and hi - lo > 1:
            raise state.OUT_OF_MEMORY("CUDA out of memory. Tried to allocate 8.00 GiB.")
        return real(record, lo, hi, dtype)

    monkeypatch.setattr(audit_run, "replay_block", failing)
    caplog.set_level(logging.INFO, logger="titan_rocm")
    r = _Toy().audit().to_dict()
    assert r["chunks"] == 4  # block 0's reference: 4 rows, one per run
    assert "the blocks' reference replays ran in 4 run(s) of rows" in " ".join(r["notes"])
    # The eager replay ran whole, as the job did: its gradients round as the job's do.
    assert [(lo, hi) for lo, hi, dtype in calls if dtype is None] == [(0, 4)] * 3
    for a, b in zip(r["tensors"], whole["tensors"], strict=True):
        tolerance = 2e-7 if a["kind"] == "loss" else 1e-15
        assert a["err_job"] == pytest.approx(b["err_job"], rel=1e-6, abs=tolerance), a["name"]
    retries = [m for m in caplog.messages if "did not fit" in m]
    assert retries == [f"numerics audit: the block 0 reference replay did not fit (Tried to "
                       f"allocate 8.00 GiB); again in {n} runs of rows" for n in (2, 4)]
    assert not any(re.search(pattern, m) for m in retries
                   for _, pattern in _CRASH_KINDS.values())


def test_a_replay_out_of_memory_on_one_row_is_one_sentence_and_gives_everything_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_rocm.numerics import audit_run, state
    from titan_rocm.numerics.result import AuditError

    def failing(*args: Any) -> Any:
        raise state.OUT_OF_MEMORY("CUDA out of memory. Tried to allocate 8.00 GiB.")

    toy = _Toy(rows=1)
    toy.model.layers["0"][0].weight.grad = torch.ones(8, 8)
    monkeypatch.setattr(audit_run, "replay_block", failing)
    with pytest.raises(AuditError, match=r"the block 0 eager replay ran out of memory on "
                                               r"cpu in 1 run\(s\) of rows \(Tried to "
                                               r"allocate 8.00 GiB\): audit fewer tokens"):
        toy.audit()
    assert torch.equal(toy.model.layers["0"][0].weight.grad, torch.ones(8, 8))
    def reference_fails(record: Any, lo: int, hi: int, dtype: Any) -> Any:
        if dtype is not None:
            raise state.OUT_OF_MEMORY("CUDA out of memory. Tried to allocate 8.00 GiB.")
        return replay.replay_block(record, lo, hi, dtype)

    from titan_rocm.numerics import replay

    monkeypatch.setattr(audit_run, "replay_block", reference_fails)
    with pytest.raises(AuditError, match=r"reference replay ran out of memory on cpu in 2 "
                                               r"run\(s\) of rows"):
        _Toy(rows=4).audit(chunks=2)  # a count the user gave is not changed


def test_an_audit_frees_what_it_recorded_without_the_garbage_collector(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The records (every block's inputs and gradients: gigabytes on a GPU) are freed when
    the audit returns, by reference counting alone: a reference cycle would keep them until
    the collector happens to run (seen on an H200: each audit of llama3 1.5B kept 4.75 GiB
    until the next ran out of memory)."""
    import gc
    import weakref

    from titan_rocm.numerics import audit

    seen: list[Any] = []
    prepare = audit.Audit.prepare

    def keep(self: Any) -> None:
        prepare(self)
        seen.append(weakref.ref(self.recorder))

    monkeypatch.setattr(audit.Audit, "prepare", keep)
    toy = _Toy()
    gc.collect()
    gc.disable()
    try:
        toy.audit()
        assert seen and seen[0]() is None
    finally:
        gc.enable()


def test_the_memory_plan_is_estimated_before_anything_is_allocated(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A block that kept S bytes in the job's forward is estimated at 3 x S x (reference
    width / job width) for its replays, plus its parameters three times at the reference's
    width and its outputs twice; the rows are split so that fits in 90 % of what is free,
    and the estimate is logged. The eager replay (3 x S) runs whole where it fits, else in
    as few runs as fit; the head's replays are held to a block's. Not even one row fitting
    is one sentence."""
    from titan_rocm.numerics import audit, precision
    from titan_rocm.numerics.record import BlockRecord
    from titan_rocm.numerics.result import AuditError
    from titan_rocm.numerics.stats import WORKSPACE_BYTES, AuditSettings

    record = BlockRecord("0", torch.nn.Linear(1000, 1000), None, [torch.zeros(8, 4, 2)],
                         [True], None, [torch.zeros(8, 4, 2)], saved_bytes=100 * 2**20)
    plan = audit.Audit([torch.nn.Module()], torch.device("cpu"), None, AuditSettings())
    ref = precision.Reference(torch.float64)
    estimate = plan._estimate(record, ref, 8)
    assert estimate == int(3 * 100 * 2**20 * 2)  # float32 job: float64 is twice as wide
    fixed = plan._fixed(record, ref)
    assert fixed == 3 * (1000 * 1000 + 1000) * 8 + 2 * 8 * 4 * 2 * 4 + WORKSPACE_BYTES
    monkeypatch.setattr(audit, "free_bytes",
                        lambda device: int((fixed + estimate / 3) / 0.9) + 100)
    caplog.set_level(logging.INFO, logger="titan_rocm")
    got = plan._plan({"0": record}, 8, ref, [])
    assert got.chunks.count == 3 and got.estimate == estimate + fixed
    assert got.eager.count == 2 and got.outside_eager.count == 1  # 3 x S is half the reference's
    assert any("replays are estimated at" in m and "the blocks in 3 run(s) of rows (eager 2)"
               in m for m in caplog.messages)
    monkeypatch.setattr(audit, "free_bytes", lambda device: int((fixed + estimate) / 0.9) + 100)
    got = plan._plan({"0": record}, 8, ref, [])
    assert (got.chunks.count, got.eager.count) == (1, 1)
    # The head's logits (8 rows x the vocabulary, four times, at float32 for eager and the
    # reference's float64; no recorder here: one token per row) are held to a block's
    # replay, eager and reference alike.
    vocab = int(2.4 * (estimate + fixed) / (4 * 8 * 4))
    head = [torch.nn.Parameter(torch.empty(vocab, 2, device="meta"))]
    got = plan._plan({"0": record}, 8, ref, head)
    assert (got.chunks.count, got.eager.count, got.outside.count,
            got.outside_eager.count) == (1, 1, 5, 3)
    monkeypatch.setattr(audit, "free_bytes", lambda device: fixed)
    with pytest.raises(AuditError, match=r"the replays would need about .* GiB on cpu "
                                               r"for one row of one block"):
        plan._plan({"0": record}, 8, ref, [])


def test_notes_of_the_applied_workarounds_reach_the_result() -> None:
    """A GEMM table the job never hit proves nothing about its kernels: the audit says how
    many lowerings the table answered (``Workaround.audit_note``), from the job's own
    decisions (``JobWorkarounds.audit_facts``); one that has nothing to say adds no note."""
    from titan_rocm.settings import RocmSettings
    from titan_rocm.tuned_gemms.choices import LookupStats
    from titan_rocm.workarounds.base import CompileSettings, Context
    from titan_rocm.workarounds.job import JobWorkarounds

    ctx = Context(settings=RocmSettings(gemm_lookup="on", precision_casts="on"),
                  compile=CompileSettings(enable=True))
    job = JobWorkarounds(ctx, ["precision_casts", "gemm_lookup", "triton_war"])
    lookup = job.instances["gemm_lookup"]
    lookup.stats = LookupStats()
    for key, hit in (("mm:a", True), ("mm:a", True), ("mm:b", True), ("bmm:c", False)):
        lookup.stats.count(key, hit)
    job.applied_by = {"precision_casts": "rocm", "gemm_lookup": "rocm"}
    assert ctx.job is job
    facts = job.audit_facts([torch.nn.Module()])
    assert facts.applied == ["precision_casts", "gemm_lookup"]
    assert facts.notes == ["gemm_lookup: 3 GEMM lowerings from the table, 1 misses (ATen) "
                           "in this process"]
    toy = _Toy()
    r = toy.audit(facts=facts).to_dict()
    assert r["notes"][0].startswith("gemm_lookup: 3 GEMM lowerings")
    assert r["workarounds_applied"] == ["precision_casts", "gemm_lookup"]


# -- the real trainer, in process -------------------------------------------------------------


@pytest.fixture
def audit_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    """tests/support/audit_trainer.py importable, the fault off, process patches undone."""
    from tests.support.moe_test_models import clean_patches

    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delenv("TITAN_ROCM_DEBUG_CORRUPT", raising=False)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    from tests.support import cpu_trainer

    cpu_trainer.cpu_patches(monkeypatch.setattr)
    monkeypatch.setattr(cpu_trainer.CpuTrainer, "patch_for_cpu", False)
    from titan_rocm.testing import corrupt

    corrupt.uninstall()
    with clean_patches(), torch._inductor.config.patch(compile_threads=1):
        from tests.support import audit_trainer

        yield audit_trainer
    from titan_rocm.workarounds.divergence_guard import hooks
    from titan_rocm.workarounds.numerics_audit import seams_tt022

    seams_tt022.uninstall()
    hooks.uninstall()
    corrupt.uninstall()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama3", "qwen3", "deepseek_v3"])
def test_the_detection_matrix_on_the_real_trainer(audit_env: Any, model: str) -> None:
    """Three blocks (deepseek_v3: block 0 dense, 1 and 2 MoE), compiled once: five clean
    seeds all ok; 0.5 %, 1 % and 3 % of the first ``mul`` of the forward (the first one the
    block's output depends on) and of the backward, in the first, the middle and the last
    block, each flagged with its block named first wrong in its direction, and a backward
    fault leaving the forward clean (titan_rocm/testing/audit_matrix.py)."""
    outcomes = audit_env.matrix(model, seeds=5)
    assert len(outcomes) == 5 + 3 * 2 * 3
    wrong = [o.to_dict() for o in outcomes if not o.judged["right"]]
    assert wrong == []
    assert all(o.hits["hits"] >= 1 for o in outcomes if o.spec is not None)
    clean = [o.result for o in outcomes if o.spec is None]
    assert all(r["job_dtype"] == "float32" and r["reference"] == "float64" for r in clean)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama3", "deepseek_v3"])
def test_real_trainer_replays_in_runs_of_rows_are_the_whole_batchs(audit_env: Any,
                                                                   model: str) -> None:
    """TorchTitan 0.2.2's real step, its 2-row micro-batch replayed in 2 runs of one row:
    the same errors as in one run (deepseek_v3: routing, token counts and shared experts per
    row too; to float32 rounding: TorchTitan's MoE computes its router scores and combines
    the experts' outputs in float32 even in a float64 pass)."""
    args = audit_env.MODELS[model] + ["--debug.seed", "3"]
    trainer, jc = audit_env.build(args)
    batch = audit_env.batch(trainer)
    whole = audit_env.audit(trainer, jc, *batch).to_dict()
    split = audit_env.audit(trainer, jc, *batch, chunks=2).to_dict()
    assert split["verdict"] == "ok" and split["chunks"] == 2 and whole["chunks"] == 1
    assert split["loss"]["reference"] == pytest.approx(whole["loss"]["reference"], rel=1e-6)
    for a, b in zip(split["tensors"], whole["tensors"], strict=True):
        assert a["name"] == b["name"]
        # A loss is summed in float32 (TorchTitan's loss casts the logits): over runs of
        # rows it rounds differently, by less than one float32 eps of relative error.
        tol = 1.2e-7 if a["kind"] == "loss" else 1e-10
        assert a["err_job"] == pytest.approx(b["err_job"], rel=1e-4, abs=tol), a["name"]


@pytest.mark.slow
@pytest.mark.parametrize("submodules,probed", [("off", 0), ("auto", 2)])
def test_the_replays_run_no_compiled_code(audit_env: Any, monkeypatch: Any, submodules: str,
                                          probed: int) -> None:
    """``set_stance("force_eager")`` on TorchTitan's per-block ``torch.compile``: the job pass
    calls the blocks' compiled graphs (counted by a counting Inductor backend), the eager and
    reference replays none; looking inside the blocks, each block's probed copy is compiled by
    the job's own backend and called once (docs/numerics-audit.md#inside-a-block)."""
    from titan_rocm.numerics import audit

    counted: dict[str, int] = {}
    finish = audit.Audit.finish

    def counting_finish(self: Any, *args: Any) -> Any:
        counted["job"] = audit_env.COMPILED_CALLS[0]
        try:
            return finish(self, *args)
        finally:
            counted["replays"] = audit_env.COMPILED_CALLS[0] - counted["job"]

    monkeypatch.setattr(audit.Audit, "finish", counting_finish)
    audit_env.COMPILED_CALLS[0] = 0
    r = audit_env.audit_job(audit_env.LLAMA + ["--compile.backend", "audit_counting",
                                                "--rocm.numerics_audit_submodules", submodules])
    assert r.to_dict()["verdict"] == "ok"
    assert counted["job"] >= 2 and counted["replays"] == probed, counted


# -- titan-rocm audit ----------------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None, nproc: int = 1, timeout: int = 600,
         trainer: bool = True) -> subprocess.CompletedProcess[str]:
    from tests.support.cpu_trainer import BASE_ARGS

    full_env = dict(os.environ)
    full_env.pop("TITAN_ROCM_DEBUG_CORRUPT", None)
    full_env.update({"PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]), **(env or {})})
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"):
        full_env.pop(var, None)
    if nproc > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                  f"--nproc_per_node={nproc}", "-m", "titan_rocm.cli"]
    else:
        launch = [sys.executable, "-m", "titan_rocm.cli"]
    # The package's CPU trainer, as a user without a GPU runs it (the fault: the CLI's).
    job = ["--trainer", "cpu-tiny", *BASE_ARGS] if trainer else []
    return subprocess.run([*launch, "audit", *job, *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=ROOT)


CONTRACT = {"schema", "command", "verdict", "exit_code", "error", "world_size", "tokens",
            "job_dtype", "reference", "settings", "first_wrong", "loss", "segments",
            "tensors", "workarounds_applied", "time_s", "peak_memory_bytes", "memory",
            "chunks", "outside_chunks", "notes", "part", "first_wrong_module"}
TENSOR_KEYS = {"name", "segment", "kind", "direction", "numel", "err_job", "err_eager",
               "ratio", "score", "outlier_fraction", "max_abs", "flagged", "reason"}
COMPILED = ("--model.converters", "rocm", "--compile.enable", "--activation_checkpoint.mode",
            "none")


@pytest.fixture
def tests_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))


@pytest.mark.slow
def test_cli_clean_json_contract_and_plot(tests_on_path: None, tmp_path: Path) -> None:
    picture = tmp_path / "audit.png"
    done = _cli(*COMPILED, "--json", "--tokens", "40", "--plot", str(picture))
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert set(out) == CONTRACT and out["verdict"] == "ok" and out["exit_code"] == 0
    assert out["schema"] == 2 and out["first_wrong"] == {"forward": None, "backward": None}
    assert out["tokens"] == 32  # whole rows of 32 while they fit
    assert out["part"] is None  # the command line audits everything at once
    assert all(set(t) == TENSOR_KEYS for t in out["tensors"] if "module" not in t)
    inside = [t for t in out["tensors"] if "module" in t]  # each block's children on their own
    assert {t["module"] for t in inside} == {"attention", "attention_norm", "feed_forward",
                                             "ffn_norm"}
    assert all(set(t) == TENSOR_KEYS | {"module"} for t in inside)
    assert out["first_wrong_module"] == {"forward": None, "backward": None}
    assert {"job", "eager", "reference", "err_job", "err_eager", "flagged"} <= set(out["loss"])
    assert picture.stat().st_size > 1000
    assert "Traceback" not in done.stderr
    # The job's log on stderr, as training shows it: what applied, and why the rest did not.
    assert "titan_rocm - INFO - titan-rocm: rocm.divergence_guard applied" in done.stderr
    assert "rocm.numerics_audit skipped: disabled by" in done.stderr
    assert "numerics audit: 2 blocks, 32 tokens, reference float64" in done.stderr


@pytest.mark.slow
def test_cli_fault_exits_1_naming_its_block_and_direction(tests_on_path: None) -> None:
    done = _cli(*COMPILED, env={"TITAN_ROCM_DEBUG_CORRUPT": "block=1,graph=forward,"
                                "fraction=0.01"})
    assert done.returncode == 1, done.stderr[-2000:]
    assert "titan-rocm numerics audit: FLAGGED" in done.stdout
    # The first mul of block 1's forward is its attention norm's (the child named too).
    assert "  first wrong in the forward: block 1, attention_norm: layers.1.attention_norm " \
        "output: " in done.stdout
    assert re.search(r"  block 0 +compiled +ok ", done.stdout), done.stdout
    assert "TEST FAULT ACTIVE" in done.stderr


@pytest.mark.parametrize("args,sentence", [
    (["--tokens", "0"], "--tokens: '0' is not valid; accepted: an integer >= 1 and <= "
     "1000000000000"),
    (["--reference-chunks", "x"], "--reference-chunks: 'x' is not valid; accepted: an "
     "integer >= 1 and <= 1000000000"),
    (["--reference-chunks", "3"], "--reference-chunks 3 is not valid; accepted: an integer "
     ">= 1 and <= 2 (the micro-batch's rows)"),
    (["--job.config_file", "/nonexistent/job.toml"], "no such file"),
    (["--model.flavor", "no_such_flavor"], "the job cannot start: KeyError"),
    (["--trainer", "nowhere"], "is not MODULE:CLASS"),
    (["--module", "llama3"], "--module is TorchTitan 0.3.0's; torchtitan 0.2.2 is installed"),
    (["--rocm.numerics_audit_outlier_quantile", "1.5"],
     "numerics_audit_outlier_quantile = 1.5 is not valid; accepted: a number > 0 and < 1"),
])
def test_cli_bad_input_exits_2_with_one_sentence_and_json(
        tests_on_path: None, args: list[str], sentence: str) -> None:
    done = _cli("--json", *args)
    assert done.returncode == 2, (done.stdout[-1000:], done.stderr[-2000:])
    out = json.loads(done.stdout)
    assert out["verdict"] == "error" and out["exit_code"] == 2 and sentence in out["error"]
    assert sentence in done.stderr and "Traceback" not in done.stderr
    assert set(out) == CONTRACT


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU builds the job")
def test_cli_on_a_machine_without_gpu_says_where_to_run(tests_on_path: None) -> None:
    """TorchTitan's own trainer needs the job's GPU: the sentence says so and where to run."""
    done = _cli("--job.config_file", "configs/llama3_debug.toml", "--json", trainer=False)
    assert done.returncode == 2, done.stderr[-2000:]
    error = json.loads(done.stdout)["error"]
    assert error.startswith("the job cannot start: ")
    assert error.endswith("(this machine has no GPU, and the audit builds the job's own "
                          "trainer: run titan-rocm audit where the job trains, e.g. torchrun "
                          "--nproc_per_node=N -m titan_rocm.cli audit ...; or try it on this "
                          "CPU: --trainer cpu (the job's model) or --trainer cpu-tiny (its "
                          "architecture, two blocks of 64))")
    assert "Traceback" not in done.stderr


def test_the_cpu_trainers_are_named_in_the_help_and_by_trainer() -> None:
    from titan_rocm.adapters.tt022 import cpu_trainer
    from titan_rocm.adapters.tt022.audit import trainer_class
    from titan_rocm.cli.audit import EPILOG
    from titan_rocm.numerics.audit import AuditError

    assert trainer_class("cpu") is cpu_trainer.CpuTrainer
    assert trainer_class("cpu-tiny") is cpu_trainer.TinyCpuTrainer
    assert "--trainer cpu" in EPILOG and "--trainer cpu-tiny" in EPILOG
    with pytest.raises(AuditError, match=r"'gpu' is not MODULE:CLASS .* nor one of cpu, "
                       "cpu-tiny"):
        trainer_class("gpu")


@pytest.mark.parametrize("plot,sentence", [
    ("audit.png", "--plot needs matplotlib, which is not installed; install it with: pip "
     "install 'titan-rocm[plot]'"),
    ("audit.txt", "--plot 'audit.txt' is not valid: the file name must end in .png or .svg"),
    ("nowhere/audit.png", "the directory 'nowhere' does not exist"),
])
def test_a_plot_that_cannot_be_drawn_is_refused_before_the_audit_runs(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        plot: str, sentence: str) -> None:
    from titan_rocm.cli import audit as audit_cli
    from titan_rocm.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails

    def no_audit(args: Any) -> None:
        raise AssertionError("the audit ran before --plot was checked")

    monkeypatch.setattr(audit_cli, "_audit", no_audit)
    assert main(["audit", "--job.config_file", "job.toml", "--plot", plot]) == 2
    err = capsys.readouterr().err
    assert sentence in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_cli_two_rank_fsdp_one_shared_verdict(tests_on_path: None, param_dtype: str) -> None:
    """Two gloo ranks, FSDP over both: each compares its shards, the sums are all-reduced,
    both ranks log the same verdict; clean ok, a fault exit 1 naming its block. With
    TorchTitan's default bfloat16 FSDP parameters the job and eager replays compute in bf16
    and the reference all-gathers each block's float32 shards as they are (FSDP's
    param_dtype lifted for that block's replay): bf16's eager error, not 0, is what the job
    is judged against."""
    args = (*COMPILED, "--parallelism.data_parallel_shard_degree", "2", "--json",
            "--training.mixed_precision_param", param_dtype)
    clean = _cli(*args, nproc=2)
    assert clean.returncode == 0, clean.stderr[-3000:]
    ok = json.loads(clean.stdout)
    assert ok["verdict"] == "ok" and ok["job_dtype"] == param_dtype
    assert ok["reference"] == "float32"  # FSDP: parameters are not re-typed
    errs = [t["err_eager"] for t in ok["tensors"] if t["kind"] == "param_grad" and t["numel"]]
    if param_dtype == "bfloat16":
        assert 1e-3 < statistics.median(errs) < 2e-2, errs  # bf16's error, against float32
    else:
        assert max(errs) < 1e-5, errs
    done = _cli(*args, env={"TITAN_ROCM_DEBUG_CORRUPT": "block=0,fraction=0.03"}, nproc=2)
    assert done.returncode == 1, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["world_size"] == 2 and out["verdict"] == "flagged"
    assert out["first_wrong"] == {"forward": None, "backward": "0"}
    for rank in (0, 1):
        assert f"rank {rank} of 2: verdict flagged" in done.stderr


def _fsdp_bf16_losses(tmp_path: Path, audit: str) -> dict[int, tuple[float | None, ...]]:
    """Rank 0's logged (loss, grad norm) per step of 5 steps of llama3 debug, compiled, FSDP
    over two gloo ranks with TorchTitan's default bfloat16 FSDP parameters."""
    from titan_rocm.logs.parse import parse_text

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]))
    env.pop("TITAN_ROCM_DEBUG_CORRUPT", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--tee",
           "3", "--master_port", str(free_port()),
           "-m", "tests.support.audit_train_main", *COMPILED, "--training.steps", "5",
           "--metrics.log_freq", "1", "--parallelism.data_parallel_shard_degree", "2",
           "--training.mixed_precision_param", "bfloat16", "--rocm.numerics_audit", audit]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900,
                          cwd=tmp_path)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    if audit != "off":
        assert ("titan-rocm numerics audit at step 1: OK (128 tokens, 2 rank(s); job "
                "bfloat16, reference float32;") in text, text[-3000:]
    records = [r for r in parse_text(text).train_records if r.rank in (None, 0)]
    return {r.step: (r.loss, r.grad_norm) for r in records}


@pytest.mark.slow
def test_in_training_audit_under_bf16_fsdp_leaves_the_trajectory_bit_identical(
        tmp_path: Path) -> None:
    """Each block's reference replay lifts FSDP's bfloat16 param_dtype for that block alone
    (its own float32 all-gather buffers) and puts the job's back: 5 steps over two ranks with
    the audit of step 1's own forward and backward log every loss and grad norm exactly as
    without it."""
    plain = _fsdp_bf16_losses(tmp_path, "off")
    audited = _fsdp_bf16_losses(tmp_path, "first_step")
    assert sorted(plain) == [1, 2, 3, 4, 5]
    assert audited == plain  # floats compared exactly, as the log prints them


@pytest.mark.slow
def test_cli_two_rank_ep_fsdp_clean_ok_and_fault_named(tests_on_path: None) -> None:
    """deepseek_v3 with EP 2 x FSDP 2 on two gloo ranks (experts sharded over the EP mesh,
    tokens moved by all-to-all): clean, one verdict ok with every expert element counted
    once; 3 % of the dense block 0's compiled backward corrupted, flagged on both ranks,
    block 0 named, block 1 clean."""
    ep = ("--model.name", "deepseek_v3", "--model.flavor", "debugmodel", *COMPILED,
          "--parallelism.expert_parallel_degree", "2",
          "--parallelism.data_parallel_shard_degree", "2",
          "--training.mixed_precision_param", "float32", "--json")
    clean = _cli(*ep, nproc=2)
    assert clean.returncode == 0, clean.stderr[-3000:]
    out = json.loads(clean.stdout)
    assert out["world_size"] == 2 and out["verdict"] == "ok"
    assert "ep=2" in clean.stderr  # TorchTitan built the expert mesh
    experts = {t["name"]: t["numel"] for t in out["tensors"] if ".moe.experts." in t["name"]}
    assert experts and all(n == 8 * 256 * 64 for n in experts.values()), experts
    bad = _cli(*ep, nproc=2, env={"TITAN_ROCM_DEBUG_CORRUPT": "block=0,fraction=0.03"})
    assert bad.returncode == 1, bad.stderr[-3000:]
    flagged = json.loads(bad.stdout)
    assert flagged["verdict"] == "flagged" and flagged["first_wrong"]["backward"] == "0"
    assert not any(s["backward"]["flagged"] or s["forward"]["flagged"]
                   for s in flagged["segments"] if s["segment"] == "1")
    for rank in (0, 1):
        assert f"rank {rank} of 2: verdict flagged" in bad.stderr


@pytest.mark.slow
def test_cli_two_rank_tp_one_shared_verdict_each_element_once(tests_on_path: None) -> None:
    """Two gloo ranks, TorchTitan's llama3 TP plan over both (Shard and Replicate DTensor
    gradients and sequence-parallel activations): clean, both ranks log the same verdict,
    exit 0, and each parameter's numel is its global size (the replicated norms counted
    once, not once per rank). Compile is off and so is loss parallel: with torch 2.13 on
    CPU/gloo the compiled TP backward fails in DTensor's redistribute and TorchTitan's
    loss_parallel fails in nll_loss, in the job's own pass."""
    done = _cli("--model.converters", "rocm", "--activation_checkpoint.mode", "none",
                "--parallelism.tensor_parallel_degree", "2",
                "--parallelism.disable_loss_parallel", "--json", nproc=2)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    out = json.loads(done.stdout)
    assert out["world_size"] == 2 and out["verdict"] == "ok"
    numel = {t["name"]: t["numel"] for t in out["tensors"] if t["kind"] == "param_grad"}
    assert numel == _llama3_debug_sizes()
    for rank in (0, 1):
        assert f"rank {rank} of 2: verdict ok" in done.stderr


def _llama3_debug_sizes() -> dict[str, int]:
    """Every parameter's global size in the llama3 debug model the CLI tests build."""
    from dataclasses import replace

    from torchtitan.protocols.train_spec import get_train_spec

    from tests.support.cpu_trainer import TINY, job_config

    jc = job_config([])
    spec = get_train_spec("llama3")
    args = replace(spec.model_args[jc.model.flavor], **TINY)
    args.update_from_config(jc)
    with torch.device("meta"):
        model = spec.model_cls(args)
    return {n: p.numel() for n, p in model.named_parameters()}


# -- rocm.numerics_audit inside training -------------------------------------------------


def _train(audit_env: Any, monkeypatch: Any, extra: list[str],
           fault: str | None = None) -> tuple[list, list, Any]:
    from torchtitan.components.metrics import MetricsProcessor

    from titan_rocm.testing import corrupt

    logged: list[tuple[int, float, float]] = []
    original = MetricsProcessor.log

    def log(self: Any, step: int, loss: Any, max_loss: Any, grad_norm: Any, *a: Any,
            **k: Any) -> Any:
        logged.append((step, float(loss), float(grad_norm)))
        return original(self, step, loss, max_loss, grad_norm, *a, **k)

    monkeypatch.setattr(audit_env.AuditTrainer, "data_batches", None)
    trainer, _ = audit_env.build(audit_env.DEEPSEEK + [
        "--training.steps", "4", "--metrics.log_freq", "1", *extra])
    if fault is not None:
        corrupt.install(trainer.model_parts, corrupt.parse(fault))
    MetricsProcessor.log = log
    try:
        try:
            trainer.train()
        except Exception:
            trainer.close()
            raise
        trainer.close()  # as torchtitan.train's main: a stop (SystemExit) closed it already
    finally:
        MetricsProcessor.log = original
    params = [p.detach().clone() for p in trainer.model_parts[0].parameters()]
    return logged, params, trainer


def _audit_of(trainer: Any) -> Any:
    from titan_rocm.adapters.tt022.converters.converter import JOB_ATTR

    return trainer.model_parts[0].__dict__[JOB_ATTR].instances["numerics_audit"]


@pytest.mark.slow
def test_in_training_audit_leaves_the_trajectory_bit_identical(
        audit_env: Any, monkeypatch: Any, caplog: pytest.LogCaptureFixture) -> None:
    """deepseek_v3 (MoE: token counts feed the expert-bias update) trained 4 steps with an
    audit due every 2 steps and without: every logged loss and grad norm and every final
    parameter bit for bit the same. Each audit is spread over steps (the default
    ``numerics_audit_spread``, two blocks: block 0, block 1, then the rest), so the one begun
    at step 1 runs at steps 1 to 3 (the one due at step 2 is not started, said in the log) and
    the next begins at 4."""
    from titan_rocm.workarounds.numerics_audit import seams_tt022

    plain, plain_params, _ = _train(audit_env, monkeypatch, ["--rocm.numerics_audit", "off"])
    seams_tt022.uninstall()
    caplog.set_level(logging.INFO, logger="titan_rocm")
    audited, audited_params, trainer = _train(audit_env, monkeypatch, [
        "--rocm.numerics_audit", "every_n_steps", "--rocm.numerics_audit_every", "2"])
    assert [s for s, _, _ in plain] == [1, 2, 3, 4]
    assert audited == plain  # floats compared exactly
    for a, b in zip(audited_params, plain_params, strict=True):
        assert torch.equal(a, b)
    audit = _audit_of(trainer)
    assert [r["step"] for r in audit.results] == [1, 2, 3, 4]
    assert [(r["part"]["part"], r["part"]["of"], r["part"]["blocks"], r["part"]["outside"])
            for r in audit.results] == [(1, 3, ["0"], False), (2, 3, ["1"], False),
                                        (3, 3, [], True), (1, 3, ["0"], False)]
    assert [{s["segment"] for s in r["segments"]} for r in audit.results[:3]] == [
        {"0"}, {"1"}, {"embedding", "head"}]
    assert [r["loss"] is not None for r in audit.results] == [False, False, True, False]
    assert all(r["verdict"] == "ok" for r in audit.results)
    assert all("job" in r["time_s"] for r in audit.results)
    assert ("titan-rocm: the numerics audit due at step 2 is not started: the one begun at "
            "step 1 has 2 part(s) to run (numerics_audit_spread 7)") in caplog.messages


def test_a_spread_audit_deals_the_blocks_then_the_rest() -> None:
    """``numerics_audit_spread``: block i into part i mod n over all but the last step (a
    dense-then-MoE model costs about the same each step), the rest last; never more parts
    than blocks and one; one step is the whole audit."""
    from titan_rocm.numerics.result import Part, spread

    keys = [str(i) for i in range(5)]
    assert spread(keys, 4) == [Part(1, 4, ("0", "3"), False), Part(2, 4, ("1", "4"), False),
                               Part(3, 4, ("2",), False), Part(4, 4, (), True)]
    assert spread(keys, 1) == [Part(1, 1, tuple(keys), True)]
    assert [p.blocks for p in spread(keys[:2], 9)] == [("0",), ("1",), ()]
    assert spread(keys, 2) == [Part(1, 2, tuple(keys), False), Part(2, 2, (), True)]


def test_the_end_of_a_spread_audit_is_one_line_no_tool_takes_for_a_verdict() -> None:
    from titan_rocm import audit_message

    ok = audit_message.complete_line([(5, "ok"), (6, "ok"), (7, "ok")])
    bad = audit_message.complete_line([(1, "ok"), (2, "flagged"), (3, "skipped")])
    assert ok == "titan-rocm numerics audit begun at step 5 ended at step 7: 3 parts, every one ok"
    assert bad == ("titan-rocm numerics audit begun at step 1 ended at step 3: 3 parts, "
                   "flagged at step(s) 2; skipped at step(s) 3")
    assert not audit_message.VERDICT.search(ok) and not audit_message.VERDICT.search(bad)


@pytest.mark.slow
def test_a_spread_audit_names_the_faulty_block_at_the_step_that_replays_it(
        audit_env: Any, monkeypatch: Any, caplog: pytest.LogCaptureFixture) -> None:
    """``first_step`` spread over the default steps, 1 % of block 1's compiled backward
    corrupted: step 1 (block 0) is ok, step 2 (block 1) flagged there, in the backward, step 3
    (the rest: teacher-forced from the job's gradients) ok; then one line for the whole."""
    caplog.set_level(logging.INFO, logger="titan_rocm")
    _, _, trainer = _train(audit_env, monkeypatch, ["--rocm.numerics_audit", "first_step"],
                           fault="block=1,graph=backward,fraction=0.01")
    results = _audit_of(trainer).results
    assert [(r["step"], r["verdict"]) for r in results] == [(1, "ok"), (2, "flagged"),
                                                            (3, "ok")]
    assert results[1]["first_wrong"] == {"forward": None, "backward": "1"}
    lines = [m for m in caplog.messages if m.startswith("titan-rocm numerics audit")]
    assert [m.splitlines()[0].split(" (")[0] for m in lines] == [
        "titan-rocm numerics audit at step 1: OK", "titan-rocm numerics audit at step 2: FLAGGED",
        "titan-rocm numerics audit at step 3: OK",
        "titan-rocm numerics audit begun at step 1 ended at step 3: 3 parts, flagged at "
        "step(s) 2"]
    assert "  part 2 of 3 (numerics_audit_spread): block 1" in lines[1].splitlines()


@pytest.mark.slow
def test_a_spread_of_one_step_is_the_whole_audit_at_that_step(
        audit_env: Any, monkeypatch: Any, caplog: pytest.LogCaptureFixture) -> None:
    """``numerics_audit_spread = 1``: step 1 replays every block and the rest, reported as
    the command line reports a whole audit (no part, the end-to-end loss), and no line for
    the end of a spread."""
    caplog.set_level(logging.INFO, logger="titan_rocm")
    _, _, trainer = _train(audit_env, monkeypatch, ["--rocm.numerics_audit", "first_step",
                                                    "--rocm.numerics_audit_spread", "1"])
    (result,) = _audit_of(trainer).results
    assert result["step"] == 1 and result["part"] is None and result["loss"] is not None
    assert [s["segment"] for s in result["segments"]] == ["embedding", "0", "1", "head"]
    assert not [m for m in caplog.messages if "begun at step" in m or "part 1 of" in m]


@pytest.mark.slow
def test_in_training_stop_policy_ends_the_run_at_a_flagged_step(audit_env: Any,
                                                                 monkeypatch: Any) -> None:
    """``numerics_audit = first_step``, policy ``stop``, the fault in block 0's compiled
    forward: ``Trainer.train()`` stops at step 1, before its optimizer step, naming block 0
    and the direction, and ends the rank with exit code 17 (the process group destroyed)."""
    from titan_rocm.adapters.stop import Stopped
    from titan_rocm.workarounds.numerics_audit.workaround import NumericsAuditFlagged

    with pytest.raises(Stopped) as stopped:
        _train(audit_env, monkeypatch, ["--rocm.numerics_audit", "first_step",
                                        "--rocm.numerics_audit_policy", "stop"],
               fault="block=0,graph=forward,fraction=0.03")
    assert stopped.value.code == 17 and not torch.distributed.is_initialized()
    assert isinstance(stopped.value.error, NumericsAuditFlagged)
    assert re.search(r"flagged step 1 \(first wrong in the forward: block 0; first wrong in "
                     r"the backward: block 0\)", str(stopped.value.error))


@pytest.mark.slow
def test_an_audit_that_cannot_run_is_one_warning_and_training_goes_on(
        audit_env: Any, monkeypatch: Any, caplog: pytest.LogCaptureFixture) -> None:
    """An audit never ends the run: one that would not fit (the plan's sentence) or fails
    in a replay (an out-of-memory) is one logged warning naming the step, and training runs
    its steps with the trajectory of a run without the audit."""
    from titan_rocm.numerics import audit
    from titan_rocm.numerics.result import AuditError
    from titan_rocm.workarounds.numerics_audit import seams_tt022

    plain, _, _ = _train(audit_env, monkeypatch, ["--rocm.numerics_audit", "off"])
    seams_tt022.uninstall()

    def no_room(self: Any, *args: Any) -> Any:
        raise AuditError("the replays would need about 9.0 GiB on cuda:0 for one row "
                               "of one block, and 1.0 GiB are free: audit fewer tokens")

    monkeypatch.setattr(audit.Audit, "_plan", no_room)
    caplog.set_level(logging.WARNING, logger="titan_rocm")
    audited, _, trainer = _train(audit_env, monkeypatch, [
        "--rocm.numerics_audit", "every_n_steps", "--rocm.numerics_audit_every", "2",
        "--rocm.numerics_audit_spread", "1"])
    assert audited == plain
    skipped = [m for m in caplog.messages if "numerics audit at step" in m]
    assert skipped == [f"titan-rocm numerics audit at step {s} skipped: the replays would "
                       "need about 9.0 GiB on cuda:0 for one row of one block, and 1.0 GiB "
                       "are free: audit fewer tokens" for s in (1, 2, 4)]
    assert _audit_of(trainer).results == []
