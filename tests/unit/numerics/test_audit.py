"""The numerics audit (docs/numerics-audit.md): its statistics on synthetic gradients, and the
real TorchTitan 0.2.2 trainer on CPU (tests/support/audit_trainer.py: CpuTrainer parallelised and
compiled by the model's own parallelize_fn), through the API, ``titan-rocm audit`` and
``rocm.numerics_audit`` inside ``Trainer.train()``."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from titan_rocm.numerics.stats import AuditSettings, compare, loss_verdict
from titan_rocm.settings import RocmSettings

TESTS = Path(__file__).resolve().parents[2]
ROOT = TESTS.parent


# -- the statistics ----------------------------------------------------------------------


def _grads(n: int = 200_000, noise: float = 1e-7, seed: int = 0) -> tuple[Any, Any, Any]:
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(n, generator=g, dtype=torch.float64)
    b = c + noise * torch.randn(n, generator=g, dtype=torch.float64)
    a = c + noise * torch.randn(n, generator=g, dtype=torch.float64)
    return a.float(), b.float(), c


def _one(a: Any, b: Any, c: Any, dtype: torch.dtype = torch.float32, **settings: Any) -> Any:
    return compare(["w"], {"w": a}, {"w": b}, {"w": c}, dtype, AuditSettings(**settings))[0]


def test_clean_gradients_are_ok() -> None:
    p = _one(*_grads())
    assert not p.flagged and p.reason is None
    assert p.ratio < 1 and p.outlier_fraction == 0.0


@pytest.mark.parametrize("fraction", [0.01, 0.03, 0.10])
def test_a_few_percent_garbage_is_flagged(fraction: float) -> None:
    a, b, c = _grads()
    picked = torch.rand(a.numel(), generator=torch.Generator().manual_seed(1)) < fraction
    a[picked] = a.roll(1)[picked]  # a neighbour's value: finite, in range
    p = _one(a, b, c)
    assert p.flagged and "rmse" in p.reason
    assert p.outlier_fraction == pytest.approx(fraction, rel=0.2)


def test_outliers_the_rmse_dilutes_are_flagged() -> None:
    """0.5 % of elements off by 50 x the eager error's RMS: the RMSE ratio stays under fudge
    (sqrt(1 + 0.005 x 2500) = 3.7), the localised statistic (10 x its 0.999 quantile,
    about 33 x its RMS) does not."""
    a, b, c = _grads(noise=1e-3)
    picked = torch.rand(a.numel(), generator=torch.Generator().manual_seed(2)) < 0.005
    a = c.float() + (b - c.float())  # the same error as eager...
    a[picked] += 50e-3 * torch.sign(torch.randn(int(picked.sum())))  # ...plus the garbage
    p = _one(a, b, c)
    assert p.ratio < AuditSettings().fudge
    assert p.flagged and "of elements" in p.reason


def _placed_worker(rank: int, store_path: str, out_dir: str) -> None:
    """One of two gloo ranks: the same gradients as DTensors placed Shard(0), Replicate and
    Partial on a 2-rank mesh, compared; this rank's verdicts written as JSON."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    a, b, c = _grads(n=4096, noise=1e-6)
    a[::50] = a.roll(1)[::50]  # 2 % garbage: flagged on the whole tensor
    expected = compare(["w"], {"w": a}, {"w": b}, {"w": c}, torch.float32, AuditSettings())
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        placed: dict[str, dict[str, Any]] = {"job": {}, "eager": {}, "reference": {}}
        for kind, x in zip(placed, (a, b, c), strict=True):
            placed[kind]["shard"] = distribute_tensor(x, mesh, [Shard(0)])
            placed[kind]["replicate"] = distribute_tensor(x, mesh, [Replicate()])
            # Halves are exact in binary: the Partial sum over two ranks is x itself.
            placed[kind]["partial"] = DTensor.from_local(x * 0.5, mesh, [Partial()])
        # Garbage in rank 1's half only: both ranks must flag it.
        index = torch.arange(a.numel())
        one_half = torch.where((index % 50 == 0) & (index >= a.numel() // 2), a, b)
        placed["job"]["half"] = distribute_tensor(one_half, mesh, [Shard(0)])
        placed["eager"]["half"] = placed["eager"]["shard"]
        placed["reference"]["half"] = placed["reference"]["shard"]
        names = ["shard", "replicate", "partial", "half"]
        got = compare(names, placed["job"], placed["eager"], placed["reference"],
                      torch.float32, AuditSettings())
    finally:
        dist.destroy_process_group()
    out = {"expected": expected[0].to_dict(), **{p.name: p.to_dict() for p in got}}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))


def test_dtensor_placements_count_each_element_once(tmp_path: Path) -> None:
    """Two gloo ranks: a gradient sharded, replicated or partial over the TP mesh gets the
    numbers the whole tensor gets in one process (a Replicate shard counted on both ranks
    would double numel; a Partial one compared unreduced would be another gradient)."""
    import torch.multiprocessing as mp

    mp.spawn(_placed_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        expected = out["expected"]
        assert expected["flagged"]
        for name in ("shard", "replicate", "partial"):
            got = out[name]
            assert got["numel"] == expected["numel"] == 4096, (name, got)
            assert got["flagged"] == expected["flagged"], (name, got)
            for key in ("err_job", "err_eager", "ratio", "max_abs", "outlier_fraction"):
                assert got[key] == pytest.approx(expected[key], rel=1e-9), (name, key)
        assert out["half"]["flagged"] and out["half"]["numel"] == 4096


def test_non_finite_and_missing_gradients_are_flagged() -> None:
    a, b, c = _grads(1000)
    a[3] = float("nan")
    assert "non-finite" in _one(a, b, c).reason
    p = compare(["w"], {"w": None}, {"w": b}, {"w": c}, torch.float32, AuditSettings())[0]
    assert p.flagged and "some passes only" in p.reason
    unused = compare(["w"], {"w": None}, {"w": None}, {"w": None}, torch.float32,
                     AuditSettings())[0]
    assert not unused.flagged and unused.numel == 0


def test_a_bf16_job_is_judged_at_its_gradients_float32_floor() -> None:
    """A bf16 job under AMP keeps float32 gradients; its eager error is ~0.5 % (measured on an
    H200: benchmarks/results/2026-12-01-h200/numerics-audit). The floor is the gradient's
    dtype's, so a 4 %-wrong gradient (8x eager) is flagged; a floor in bf16 units (64 x 2^-7 =
    0.5) would have passed it, as the first H200 run of the injected fault did."""
    a, b, c = _grads(noise=5e-3)
    wrong = c.float() + 4 * (a - c.float()) * 2.5  # 10x eager's error
    p = _one(wrong, b, c, dtype=torch.bfloat16)
    assert p.flagged and "rmse" in p.reason and p.ratio == pytest.approx(10, rel=0.05)
    assert not _one(a, b, c, dtype=torch.bfloat16).flagged
    # The loss of a bf16 job is computed in float32: its floor is float32's.
    assert loss_verdict(6.0 * (1 + 1e-3), 6.0 * (1 + 1e-6), 6.0, torch.bfloat16,
                        AuditSettings())["flagged"]


class _Toy:
    """A trainer-shaped stand-in: a linear model and TorchTitan's loss (each token's loss
    summed, over the step's token count, fixed before the passes), in the parameters' dtype;
    ``oom`` makes the listed calls of the step run out of memory."""

    def __init__(self, rows: int = 4, oom: tuple[int, ...] = ()) -> None:
        from types import SimpleNamespace

        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 3)
        self.trainer = SimpleNamespace(model_parts=[self.model], device="cpu",
                                       maybe_enable_amp=None)
        self.inputs = {"input": torch.randn(rows, 5, 4)}
        self.labels = torch.randn(rows, 5, 3)
        self.denominator = self.labels.numel()
        self.oom, self.calls, self.rows_seen = oom, 0, []

    def step(self, inputs: dict[str, Any], labels: Any) -> Any:
        from titan_rocm.numerics.audit import OUT_OF_MEMORY

        self.calls += 1
        self.rows_seen.append(labels.shape[0])
        if self.calls in self.oom:
            raise OUT_OF_MEMORY("CUDA out of memory. Tried to allocate 8.00 GiB.")
        w = self.model.weight
        pred = self.model(inputs["input"].to(w.dtype))
        loss = (pred - labels.to(w.dtype)).square().sum() / self.denominator
        loss.backward()
        return loss

    def run(self, chunks: int | None = None) -> Any:
        from titan_rocm.numerics.audit import run_passes

        return run_passes(self.trainer, self.step, self.inputs, self.labels, AuditSettings(),
                          chunks)


def test_a_pass_out_of_memory_on_one_row_is_one_sentence_naming_the_pass() -> None:
    """A pass that runs out of memory with nothing left to split (one row) ends in the
    audit's own sentence, naming the pass, with the gradients given back."""
    from titan_rocm.numerics.audit import AuditError

    toy = _Toy(rows=1, oom=(2,))
    toy.model.weight.grad = torch.ones_like(toy.model.weight)
    with pytest.raises(AuditError, match=r"the eager pass ran out of memory on cpu \(CUDA out"
                                         r".*\): audit fewer tokens"):
        toy.run()
    assert torch.equal(toy.model.weight.grad, torch.ones_like(toy.model.weight))


def test_a_pass_out_of_memory_runs_again_in_more_runs_of_rows(
        caplog: pytest.LogCaptureFixture) -> None:
    """On an H200 the float64 reference of llama3 1.5B over 8 x 2048 tokens ran out of memory
    (attention's float64 math kernel keeps the scores: 8 GiB a layer;
    benchmarks/results/2026-12-01-h200/audit-table-attempt). One process runs the pass again
    in twice as many runs of rows until it fits; the result says so, and its numbers are the
    whole micro-batch's."""
    import logging
    import re

    from titan_rocm.logs.parse import _CRASH_KINDS

    whole = _Toy().run()
    caplog.set_level(logging.INFO, logger="titan_rocm")
    toy = _Toy(oom=(2, 4))  # eager whole fails, eager in 2 fails (its 2nd run), in 4 fits
    r = toy.run()
    assert r.chunks == {"job": 1, "eager": 4, "reference": 4}
    assert toy.rows_seen == [4, 4, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1]
    assert r.notes == ["to fit in memory, the eager pass ran in 4 runs of rows and the "
                       "reference pass ran in 4 runs of rows (gradients accumulated: the "
                       "whole micro-batch's)"]
    for got, want in zip(r.parameters, whole.parameters, strict=True):
        assert got.err_job == pytest.approx(want.err_job, rel=1e-9, abs=1e-15), got.name
    assert r.loss["reference"] == pytest.approx(whole.loss["reference"], rel=1e-12)
    assert r.to_dict()["chunks"] == r.chunks
    from titan_rocm.numerics.report import format_report

    assert "note: to fit in memory, the eager pass ran in 4 runs" in format_report(r.to_dict())
    retries = [m for m in caplog.messages if "running it again" in m]
    assert retries == [
        "numerics audit: the eager pass did not fit (Tried to allocate 8.00 GiB); running it "
        f"again in {n} runs of rows" for n in (2, 4)]
    # A retried pass is not the job's crash: check-log's crash patterns must not match it.
    assert not any(re.search(pattern, m) for m in retries
                   for _, pattern in _CRASH_KINDS.values())


def test_reference_chunks_given_are_exact_and_checked() -> None:
    """``--reference-chunks N``: the eager and reference passes in N runs of rows give the
    whole micro-batch's loss and gradients (float64: equal to rounding); the job pass stays
    whole; N beyond the rows is refused naming both; an out-of-memory with N given is not
    retried."""
    from titan_rocm.numerics.audit import AuditError, row_chunks

    whole = _Toy(rows=5).run()
    toy = _Toy(rows=5)
    r = toy.run(chunks=3)
    assert r.chunks == {"job": 1, "eager": 3, "reference": 3}
    assert toy.rows_seen == [5, 2, 1, 2, 2, 1, 2]
    assert r.loss["reference"] == pytest.approx(whole.loss["reference"], rel=1e-12)
    assert r.loss["job"] == whole.loss["job"]
    for got, want in zip(r.parameters, whole.parameters, strict=True):
        assert got.err_job == pytest.approx(want.err_job, rel=1e-9, abs=1e-15), got.name
    assert [c[1].shape[0] for c in row_chunks({}, torch.zeros(8, 2), 3)] == [3, 2, 3]
    with pytest.raises(AuditError, match=r"--reference-chunks 6 .* from 1 to its 5 row"):
        _Toy(rows=5).run(chunks=6)
    with pytest.raises(AuditError, match=r"eager pass ran out of memory on cpu in 2 runs of "
                                         r"rows .*--reference-chunks N \(up to the micro"
                                         r"-batch's 4"):
        _Toy(oom=(2,)).run(chunks=2)


def test_loss_verdict_uses_the_floor() -> None:
    assert not loss_verdict(6.0 + 1e-6, 6.0, 6.0, torch.float32, AuditSettings())["flagged"]
    assert loss_verdict(6.01, 6.0, 6.0, torch.float32, AuditSettings())["flagged"]


def test_settings_come_from_rocm_and_bad_values_name_what_is_accepted() -> None:
    s = AuditSettings.of(RocmSettings(numerics_audit_fudge=4.0))
    assert s.fudge == 4.0 and s.to_dict()["outlier_quantile"] == 0.999
    with pytest.raises(ValueError, match="numerics_audit_outlier_quantile = 1.5 .* between"):
        AuditSettings(outlier_quantile=1.5)
    with pytest.raises(ValueError, match=r"numerics_audit_fudge = -1 .*a number > 0"):
        RocmSettings(numerics_audit_fudge=-1)
    with pytest.raises(ValueError, match="numerics_audit = 'always'.*first_step"):
        RocmSettings(numerics_audit="always")


# -- the real trainer, in process -----------------------------------------------------------


@pytest.fixture
def audit_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    """tests/support/audit_trainer.py importable, its corruption off, process patches undone."""
    from tests.support.moe_test_models import clean_patches

    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delenv("TITAN_ROCM_DEBUG_CORRUPT", raising=False)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    from tests.support import cpu_trainer

    cpu_trainer.cpu_patches(monkeypatch.setattr)
    monkeypatch.setattr(cpu_trainer.CpuTrainer, "patch_for_cpu", False)
    with clean_patches(), torch._inductor.config.patch(compile_threads=1):
        from tests.support import audit_trainer

        yield audit_trainer
    from titan_rocm.numerics import corrupt
    from titan_rocm.workarounds import numerics_audit
    from titan_rocm.workarounds.divergence_guard import hooks

    numerics_audit.uninstall()
    hooks.uninstall()
    corrupt.uninstall()


def _flagged_blocks(result: Any) -> set[str]:
    return {b["block"] for b in result.blocks() if b["flagged"]}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama3", "deepseek_v3"])
def test_clean_real_trainer_is_ok_over_five_seeds(audit_env: Any, model: str) -> None:
    args = audit_env.LLAMA if model == "llama3" else audit_env.DEEPSEEK
    for seed in range(5):
        r = audit_env.audit_job(args + ["--debug.seed", str(seed)])
        assert not r.flagged, (seed, [p.reason for p in r.parameters if p.flagged], r.loss)
        assert r.reference_dtype == "float64" and r.job_dtype == "float32"
        assert r.attribution.compiled("layers.0.attention.wq.weight")
        assert all(p.numel for p in r.parameters if "expert" not in p.name)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama3", "deepseek_v3"])
def test_real_trainer_reference_in_runs_of_rows_is_the_whole_batchs(audit_env: Any,
                                                                    model: str) -> None:
    """TorchTitan 0.2.2's real step, its 2-row micro-batch audited with the eager and float64
    passes in 2 runs of one row: the same reference loss and the same errors as in one run
    (deepseek_v3: routing, expert token counts and the shared experts per row too). Equal to
    float32 rounding, not float64's: TorchTitan's MoE computes its router scores and combines
    the experts' outputs in float32 even in the float64 pass (0.2.2 models/moe/moe.py,
    ``scores.to(torch.float32)``, ``routed_input.to(torch.float32)``)."""
    args = (audit_env.LLAMA if model == "llama3" else audit_env.DEEPSEEK) + ["--debug.seed", "3"]
    whole = audit_env.audit_job(args)
    split = audit_env.audit_job(args, chunks=2)
    assert not split.flagged
    assert split.chunks == {"job": 1, "eager": 2, "reference": 2} and whole.chunks["eager"] == 1
    assert split.loss["reference"] == pytest.approx(whole.loss["reference"], rel=1e-6)
    assert split.loss["eager"] == pytest.approx(whole.loss["eager"], rel=1e-5)
    for got, want in zip(split.parameters, whole.parameters, strict=True):
        assert got.name == want.name
        # float64 reference: equal to rounding; the job's (float32) error against it alike.
        assert got.err_job == pytest.approx(want.err_job, rel=1e-6, abs=1e-12), got.name


@pytest.mark.slow
def test_eager_and_reference_passes_run_no_compiled_code(audit_env: Any,
                                                        monkeypatch: Any) -> None:
    """``set_stance("force_eager")`` on TorchTitan's per-block ``torch.compile``: the job pass
    calls the blocks' compiled graphs (counted by a counting Inductor backend), the eager and
    float64 passes none."""
    from titan_rocm.numerics import audit

    calls: list[int] = []
    step_of = audit.trainer_step

    def counted_step(trainer: Any, labels: Any) -> Any:
        inner = step_of(trainer, labels)

        def step(input_dict: Any, labels: Any) -> Any:
            before = audit_env.COMPILED_CALLS[0]
            loss = inner(input_dict, labels)
            calls.append(audit_env.COMPILED_CALLS[0] - before)
            return loss

        return step

    monkeypatch.setattr(audit, "trainer_step", counted_step)
    r = audit_env.audit_job(audit_env.LLAMA + ["--compile.backend", "audit_counting"])
    assert not r.flagged
    job, eager, reference = calls
    assert job >= 2 and eager == 0 and reference == 0, calls


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.01, 0.03, 0.10])
def test_corrupted_block_backward_is_flagged_and_named(audit_env: Any, monkeypatch: Any,
                                                        fraction: float) -> None:
    """The injector corrupts ``fraction`` of the first ``mul`` in block 0's compiled backward
    (compiled code only): block 0's parameters (and the embedding below it) flagged, block
    1's not."""
    monkeypatch.setenv("TITAN_ROCM_DEBUG_CORRUPT", f"block=0,fraction={fraction}")
    r = audit_env.audit_job(audit_env.LLAMA)
    flagged = {p.name for p in r.parameters if p.flagged}
    assert any(n.startswith("layers.0.") for n in flagged), flagged
    assert not any(n.startswith("layers.1.") for n in flagged), flagged
    assert "0" in _flagged_blocks(r) <= {"0", "(outside blocks)"}
    assert r.origin() == "0"
    assert not r.loss["flagged"]  # the forward is untouched


@pytest.mark.slow
def test_corrupted_moe_block_is_the_origin(audit_env: Any, monkeypatch: Any) -> None:
    """deepseek_v3's MoE block (block 1: attention compiled, MoE eager under the mixed
    compile's ``moe`` scope) corrupted: it is named first wrong; block 0 inherits the error
    through the backward."""
    monkeypatch.setenv("TITAN_ROCM_DEBUG_CORRUPT", "block=1,fraction=0.03")
    r = audit_env.audit_job(audit_env.DEEPSEEK)
    assert r.origin() == "1"
    row = next(b for b in r.blocks() if b["block"] == "1")
    assert row["flagged"] and row["scope"] in ("mixed", "eager")
    text = r.to_dict()
    assert any(p["name"].startswith("layers.1.moe.") and p["flagged"]
               for p in text["parameters"])


# -- titan-rocm audit ----------------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None, nproc: int = 1,
         timeout: int = 600) -> subprocess.CompletedProcess[str]:
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
    return subprocess.run(
        [*launch, "audit", "--trainer", "tests.support.audit_trainer:AuditTrainer", *BASE_ARGS,
         *args],
        capture_output=True, text=True, env=full_env, timeout=timeout, cwd=ROOT,
    )


CONTRACT = {"schema", "verdict", "exit_code", "error", "world_size", "tokens",
            "reference_dtype", "job_dtype", "settings", "loss", "parameters", "blocks",
            "time_s", "peak_memory_bytes"}
PARAM_KEYS = {"name", "block", "compiled", "workarounds", "numel", "err_job", "err_eager",
              "ratio", "max_abs", "outlier_fraction", "flagged", "reason"}


@pytest.fixture
def tests_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))


@pytest.mark.slow
def test_cli_clean_json_contract_and_plot(tests_on_path: None, tmp_path: Path) -> None:
    picture = tmp_path / "audit.png"
    done = _cli("--model.converters", "rocm", "--compile.enable",
                "--activation_checkpoint.mode", "none", "--json", "--tokens", "40",
                "--plot", str(picture))
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert CONTRACT <= set(out) and out["verdict"] == "ok" and out["exit_code"] == 0
    assert out["tokens"] == 32  # whole rows of 32 while they fit
    assert all(PARAM_KEYS <= set(p) for p in out["parameters"])
    assert {"job", "eager", "reference", "err_job", "err_eager", "flagged"} <= set(out["loss"])
    assert picture.stat().st_size > 1000
    assert "Traceback" not in done.stderr
    # The job's log on stderr, as training shows it: what applied, and why the rest did not.
    assert "titan_rocm - INFO - titan-rocm: rocm.divergence_guard applied" in done.stderr
    assert "rocm.numerics_audit skipped: disabled by" in done.stderr


@pytest.mark.slow
def test_cli_corrupted_block_exits_1_naming_it(tests_on_path: None) -> None:
    done = _cli("--model.converters", "rocm", "--compile.enable",
                "--activation_checkpoint.mode", "none",
                env={"TITAN_ROCM_DEBUG_CORRUPT": "block=1,fraction=0.03"})
    assert done.returncode == 1, done.stderr[-2000:]
    assert "numerics audit: FLAGGED" in done.stdout
    assert "first wrong in the backward: block 1" in done.stdout
    assert "  block 1 (compiled): backward wrong for" in done.stdout


@pytest.mark.parametrize("args,sentence", [
    (["--tokens", "0"], "--tokens 0 is not valid; accepted: a whole number >= 1"),
    (["--reference-chunks", "0"], "--reference-chunks 0 is not valid; accepted: a whole "
     "number >= 1"),
    (["--reference-chunks", "3"], "--reference-chunks 3 is not valid for this micro-batch; "
     "accepted: a whole number from 1 to its 2 row(s)"),
    (["--job.config_file", "/nonexistent/job.toml"], "no such file"),
    (["--model.flavor", "no_such_flavor"], "the job cannot start: KeyError"),
    (["--trainer", "nowhere"], "is not MODULE:CLASS"),
])
def test_cli_bad_input_exits_2_with_one_sentence_and_json(
        tests_on_path: None, args: list[str], sentence: str) -> None:
    done = _cli("--json", *args)
    assert done.returncode == 2, (done.stdout[-1000:], done.stderr[-2000:])
    out = json.loads(done.stdout)
    assert out["verdict"] == "error" and out["exit_code"] == 2 and sentence in out["error"]
    assert sentence in done.stderr and "Traceback" not in done.stderr
    assert CONTRACT <= set(out)


@pytest.mark.slow
@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_cli_two_rank_fsdp_one_shared_verdict(tests_on_path: None, param_dtype: str) -> None:
    """Two gloo ranks, FSDP over both: each compares its shards, the sums are all-reduced,
    both ranks log the same verdict; clean ok, corrupted exit 1 - rank 0 prints. With
    TorchTitan's default bfloat16 FSDP parameters the job and eager passes compute in bf16
    and the reference all-gathers the float32 shards as they are (FSDP's param_dtype lifted
    for that pass): bf16's eager error, not 0, is what the job is judged against."""
    args = ("--model.converters", "rocm", "--compile.enable", "--activation_checkpoint.mode",
            "none", "--parallelism.data_parallel_shard_degree", "2", "--json",
            "--training.mixed_precision_param", param_dtype)
    clean = _cli(*args, nproc=2)
    assert clean.returncode == 0, clean.stderr[-3000:]
    ok = json.loads(clean.stdout)
    assert ok["verdict"] == "ok" and ok["job_dtype"] == param_dtype
    assert ok["reference_dtype"] == "float32"  # FSDP: parameters are not re-typed
    errs = [p["err_eager"] for p in ok["parameters"] if p["numel"]]
    if param_dtype == "bfloat16":
        assert 1e-3 < statistics.median(errs) < 2e-2, errs  # bf16's error, against float32
    else:
        assert max(errs) < 1e-5, errs
    done = _cli(*args, env={"TITAN_ROCM_DEBUG_CORRUPT": "block=0,fraction=0.03"}, nproc=2)
    assert done.returncode == 1, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["world_size"] == 2 and out["verdict"] == "flagged"
    flagged = {b["block"] for b in out["blocks"] if b["flagged"]}
    assert "0" in flagged <= {"0", "(outside blocks)"}
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
           "3", "--master_port", str(29_500 + os.getpid() % 400 + (audit != "off")),
           "-m", "tests.support.audit_train_main", "--model.converters", "rocm",
           "--compile.enable", "--activation_checkpoint.mode", "none", "--training.steps",
           "5", "--metrics.log_freq", "1", "--parallelism.data_parallel_shard_degree", "2",
           "--training.mixed_precision_param", "bfloat16", "--rocm.numerics_audit", audit]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    if audit != "off":
        assert "numerics audit: OK (128 tokens, 2 rank(s); job bfloat16, eager bfloat16, " \
               "reference float32)" in text, text[-3000:]
    records = [r for r in parse_text(text).train_records if r.rank in (None, 0)]
    return {r.step: (r.loss, r.grad_norm) for r in records}


@pytest.mark.slow
def test_in_training_audit_under_bf16_fsdp_leaves_the_trajectory_bit_identical(
        tmp_path: Path) -> None:
    """The reference pass lifts FSDP's bfloat16 param_dtype for itself (its own float32
    all-gather buffers) and puts the job's back: 5 steps over two ranks with the audit at
    step 1 log every loss and grad norm exactly as without it."""
    plain = _fsdp_bf16_losses(tmp_path, "off")
    audited = _fsdp_bf16_losses(tmp_path, "first_step")
    assert sorted(plain) == [1, 2, 3, 4, 5]
    assert audited == plain  # floats compared exactly, as the log prints them


@pytest.mark.slow
def test_cli_two_rank_ep_fsdp_clean_ok_and_fault_named(tests_on_path: None) -> None:
    """deepseek_v3 with EP 2 x FSDP 2 on two gloo ranks (experts sharded over the EP mesh,
    tokens moved by all-to-all): clean, one verdict ok with every expert element counted once;
    3 % of the dense block 0's compiled backward corrupted, flagged on both ranks, block 0
    named (the MoE block runs eager under the default "block" scope: no compiled code to
    corrupt there)."""
    ep = ("--model.name", "deepseek_v3", "--model.flavor", "debugmodel",
          "--model.converters", "rocm", "--compile.enable", "--activation_checkpoint.mode",
          "none", "--parallelism.expert_parallel_degree", "2",
          "--parallelism.data_parallel_shard_degree", "2",
          "--training.mixed_precision_param", "float32", "--json")
    clean = _cli(*ep, nproc=2)
    assert clean.returncode == 0, clean.stderr[-3000:]
    out = json.loads(clean.stdout)
    assert out["world_size"] == 2 and out["verdict"] == "ok"
    assert "ep=2" in clean.stderr  # TorchTitan built the expert mesh
    experts = {p["name"]: p["numel"] for p in out["parameters"] if ".moe.experts." in p["name"]}
    assert experts and all(n == 8 * 256 * 64 for n in experts.values()), experts
    bad = _cli(*ep, nproc=2, env={"TITAN_ROCM_DEBUG_CORRUPT": "block=0,fraction=0.03"})
    assert bad.returncode == 1, bad.stderr[-3000:]
    flagged = json.loads(bad.stdout)
    assert flagged["verdict"] == "flagged" and flagged["origin"] == "0"
    assert not any(b["flagged"] for b in flagged["blocks"] if b["block"] == "1")
    for rank in (0, 1):
        assert f"rank {rank} of 2: verdict flagged" in bad.stderr


@pytest.mark.slow
def test_cli_two_rank_tp_one_shared_verdict_each_element_once(tests_on_path: None) -> None:
    """Two gloo ranks, TorchTitan's llama3 TP plan over both (Shard and Replicate DTensor
    gradients): clean, both ranks log the same verdict, exit 0, and each parameter's numel is
    its global size (the replicated norms counted once, not once per rank). Compile is off
    and so is loss parallel: with torch 2.13 on CPU/gloo the compiled TP backward fails in
    DTensor's redistribute (AttributeError: 'Tensor' object has no attribute '_local_tensor')
    and TorchTitan's loss_parallel fails in nll_loss (mixed torch.Tensor and DTensor), in
    the job's own pass, so the injected fault (compiled code only) cannot run under TP here."""
    done = _cli("--model.converters", "rocm", "--activation_checkpoint.mode", "none",
                "--parallelism.tensor_parallel_degree", "2",
                "--parallelism.disable_loss_parallel", "--json", nproc=2)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    out = json.loads(done.stdout)
    assert out["world_size"] == 2 and out["verdict"] == "ok"
    numel = {p["name"]: p["numel"] for p in out["parameters"]}
    sizes = _llama3_debug_sizes()
    assert numel == sizes
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


def _train(audit_env: Any, monkeypatch: Any, extra: list[str]) -> tuple[list, list, Any]:
    from torchtitan.components.metrics import MetricsProcessor

    from tests.support.cpu_trainer import job_config

    logged: list[tuple[int, float, float]] = []
    original = MetricsProcessor.log

    def log(self: Any, step: int, loss: Any, max_loss: Any, grad_norm: Any, *a: Any,
            **k: Any) -> Any:
        logged.append((step, float(loss), float(grad_norm)))
        return original(self, step, loss, max_loss, grad_norm, *a, **k)

    monkeypatch.setattr(audit_env.AuditTrainer, "data_batches", None)
    jc = job_config(audit_env.COMPILED + audit_env.DEEPSEEK + [
        "--training.steps", "4", "--metrics.log_freq", "1", *extra])
    torch._dynamo.reset()
    trainer = audit_env.AuditTrainer(jc)
    MetricsProcessor.log = log
    try:
        trainer.train()
    finally:
        MetricsProcessor.log = original
        trainer.close()
    params = [p.detach().clone() for p in trainer.model_parts[0].parameters()]
    return logged, params, trainer


@pytest.mark.slow
def test_in_training_audit_leaves_the_trajectory_bit_identical(audit_env: Any,
                                                               monkeypatch: Any) -> None:
    """deepseek_v3 (MoE: token counts feed the expert-bias update) trained 4 steps with the
    audit at steps 1, 2 and 4 and without: every logged loss and grad norm and every final
    parameter bit for bit the same."""
    from titan_rocm.workarounds import numerics_audit

    plain, plain_params, _ = _train(audit_env, monkeypatch, ["--rocm.numerics_audit", "off"])
    numerics_audit.uninstall()
    audited, audited_params, trainer = _train(audit_env, monkeypatch, [
        "--rocm.numerics_audit", "every_n_steps", "--rocm.numerics_audit_every", "2"])
    assert [s for s, _, _ in plain] == [1, 2, 3, 4]
    assert audited == plain  # floats compared exactly
    for a, b in zip(audited_params, plain_params, strict=True):
        assert torch.equal(a, b)
    audit = numerics_audit._audits[0]
    assert [r["step"] for r in audit.results] == [1, 2, 4]
    assert all(r["verdict"] == "ok" for r in audit.results)


@pytest.mark.slow
def test_in_training_stop_policy_ends_the_run_at_a_flagged_step(audit_env: Any,
                                                                 monkeypatch: Any) -> None:
    """``numerics_audit = first_step``, policy ``stop``, the injector in block 0's compiled
    backward: ``Trainer.train()`` stops at step 1, before its optimizer step, naming block 0."""
    from titan_rocm.workarounds.numerics_audit import NumericsAuditFlagged

    monkeypatch.setenv("TITAN_ROCM_DEBUG_CORRUPT", "block=0,fraction=0.03")
    with pytest.raises(NumericsAuditFlagged, match=r"flagged step 1 \(block 0 first wrong"):
        _train(audit_env, monkeypatch, ["--rocm.numerics_audit", "first_step",
                                        "--rocm.numerics_audit_policy", "stop"])


def test_applied_workarounds_notes_reach_the_audit_result() -> None:
    """A GEMM table the job never hit proves nothing about its kernels: the audit says how
    many lowerings the table answered (``Workaround.audit_note``), collected from the job's
    applied workarounds; one that has nothing to say adds no note."""
    from types import SimpleNamespace

    from titan_rocm.adapters.tt022.converters.converter import JOB_ATTR
    from titan_rocm.numerics.attribution import attribute
    from titan_rocm.tuning.choices import LookupStats
    from titan_rocm.workarounds.base import CompileSettings, Context
    from titan_rocm.workarounds.gemm_lookup.workaround import GemmLookup

    lookup = GemmLookup(Context(settings=RocmSettings(gemm_lookup="on"),
                                compile=CompileSettings(enable=True)))
    assert lookup.audit_note() is None  # not installed: nothing counted
    lookup.stats = LookupStats()
    for key, hit in (("mm:a", True), ("mm:a", True), ("mm:b", True), ("bmm:c", False)):
        lookup.stats.count(key, hit)
    quiet = SimpleNamespace(audit_note=lambda: None)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleDict({"0": torch.nn.Linear(2, 2)})
    model.__dict__[JOB_ATTR] = SimpleNamespace(
        instances={"precision_casts": quiet, "gemm_lookup": lookup, "triton_war": quiet},
        applied_by={"precision_casts", "gemm_lookup"})
    got = attribute([model])
    assert got.applied == ["precision_casts", "gemm_lookup"]
    assert got.notes == ["gemm_lookup: 3 GEMM lowerings from the table, 1 misses (ATen) in "
                         "this process"]
