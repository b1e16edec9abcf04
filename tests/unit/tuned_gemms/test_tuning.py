"""``titan-rocm tune`` and ``rocm.gemm_lookup`` on CPU (docs/validated-tuning.md).

Inductor's C++ GEMM template gives real second candidates on CPU (fp32 bmm, ``--backends
ATEN,CPP``); faults are injected through ``TITAN_ROCM_TUNE_FAULTS``. The lookup table itself
is CUDA/ROCm only in Inductor: the converter is tested through TableChoices with an
injected device key.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from titan_rocm.cli import main as cli
from titan_rocm.tuned_gemms import problems, records, table

REPO = Path(__file__).resolve().parents[3]
ROCM_KEY = "gfx942:sramecc+:xnack-"
ROCM_PARAMS = {"ACC_TYPE": "tl.float32", "ALLOW_TF32": False, "BLOCK_K": 64, "BLOCK_M": 128,
               "BLOCK_N": 128, "EVEN_K": True, "GROUP_M": 8, "USE_FAST_ACCUM": False,
               "kpack": 2, "matrix_instr_nonkdim": 16, "num_stages": 2, "num_warps": 8,
               "waves_per_eu": 0}


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp.parent / "inductor-cache"),
               PYTHONPATH=f"{REPO}:{REPO / 'tests'}", **extra)
    env.pop("TITAN_ROCM_TUNE_FAULTS", None)
    # A child starts its own process group: never the rendezvous an earlier in-process
    # trainer test left in os.environ (its store still listens on that port).
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                "LOCAL_WORLD_SIZE"):
        env.pop(key, None)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def problems_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("problems") / "problems.jsonl"
    subprocess.run([sys.executable, str(REPO / "tests" / "support" / "tune_problems.py"), str(out)],
                   check=True, env=_env(out.parent), capture_output=True)
    return out


def _tune(problems_path: Path, out: Path, *flags: str, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "titan_rocm.cli", "tune", "run", str(problems_path), "-o",
           str(out), "--backends", "ATEN,CPP", "--timeout", "2", *flags]
    return subprocess.run(cmd, env=_env(out.parent, **env), capture_output=True, text=True,
                          timeout=240)


def _results(path: Path) -> list[dict[str, Any]]:
    return [r for r in records.read_records(path)[0] if r["type"] == "result"]


# -- problems, records, table: torch-free ---------------------------------------------------

def test_problems_file_round_trips_and_rejects_garbage(problems_file: Path, tmp_path: Path) -> None:
    loaded = problems.read(problems_file)
    assert len(loaded.problems) == 3 and {p.op for p in loaded.problems} == {"bmm"}
    assert all(p.key.endswith("+bmm") and p.key == p.calls[0].key for p in loaded.problems)
    again = problems.parse(problems.dumps(loaded.header, loaded.problems), "x")
    assert [p.to_dict() for p in again.problems] == [p.to_dict() for p in loaded.problems]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "problem"}\n')
    with pytest.raises(problems.ProblemsError, match="job"):
        problems.read(bad)


def test_garbled_lines_are_skipped_and_counted_and_appends_stay_whole(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"type": "run", "problems": []}\n{"type": "result", "task": "a", "sta')
    appender = records.Appender(path)  # the cut line stays one garbled line
    appender.write({"type": "result", "task": "b", "status": "pass", "key": "k"})
    appender.close()
    state = records.load_state(path)
    assert state.garbled == 1 and list(state.results) == ["b"] and state.run is not None


def test_a_task_started_twice_without_a_result_is_not_run_again(tmp_path: Path) -> None:
    state = records.State()
    for _ in range(2):
        state.add({"type": "started", "task": "t"})
    state.add({"type": "started", "task": "u"})
    assert state.started_twice() == ["t"]


def _state(results: list[dict[str, Any]], device_key: str | None = ROCM_KEY) -> records.State:
    state = records.State()
    env = {"device": "AMD Instinct MI300X", "device_key": device_key, "torch": "2.11.0",
           "triton": "3.6.0", "hip": "7.0", "cuda": None, "fp32_precision": "highest"}
    state.add({"type": "run", "problems": ["K+mm"], "job": {"id": "j"}})
    state.add({"type": "env", "env": env})
    state.add({"type": "problem", "key": "K+mm", "op": "mm", "keys": ["K+mm", "K2+mm"],
               "tasks": [r["task"] for r in results]})
    for r in results:
        state.add({"type": "result", "key": "K+mm", "params": {}, "template_hash": None, **r})
    return state


def test_table_round_trip_with_a_rocm_entry(tmp_path: Path) -> None:
    state = _state([
        {"task": "a", "template_id": "aten::mm", "status": "pass", "time_ms": 2.0},
        {"task": "b", "template_id": "triton::mm", "status": "pass", "time_ms": 1.0,
         "params": ROCM_PARAMS, "template_hash": "h1"},
        {"task": "c", "template_id": "triton::mm", "status": "mismatch", "time_ms": None,
         "params": {**ROCM_PARAMS, "BLOCK_K": 32}},
    ])
    built = table.build(state, min_speedup=1.0)
    out = tmp_path / "t.json"
    table.write(built, out)
    back = table.read(out)
    entry = {"template_id": "triton::mm", **ROCM_PARAMS, "template_hash": "h1"}
    # The winner is under every key the lowering asks for, device-specific.
    assert back.table == {f"{ROCM_KEY}+K+mm": [entry], f"{ROCM_KEY}+K2+mm": [entry]}
    assert back.meta["device_key"] == ROCM_KEY and back.meta["hip"] == "7.0"
    assert table.meta_mismatches(back.meta, {**back.meta}) == []
    assert table.meta_mismatches(back.meta, {**back.meta, "triton": "3.5.0"}) == [
        "triton: table '3.6.0', running '3.5.0'"]
    # Not beating ATen by the asked speed-up: ATen's entry.
    slow = table.build(state, min_speedup=2.5)
    assert slow.table[f"{ROCM_KEY}+K+mm"] == [{"template_id": "aten::mm"}]


def test_a_failed_candidate_never_enters_a_table() -> None:
    for status in ("mismatch", "nan", "cuda_error", "crash", "hang", "compile_error"):
        built = table.build(_state([
            {"task": "a", "template_id": "aten::mm", "status": "pass", "time_ms": 2.0},
            {"task": "b", "template_id": "triton::mm", "status": status, "time_ms": 0.1}]))
        assert built.table[f"{ROCM_KEY}+K+mm"] == [{"template_id": "aten::mm"}], status


def test_table_cli_check_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    results = tmp_path / "r.jsonl"
    appender = records.Appender(results)
    complete = _state([{"task": "a", "template_id": "aten::mm", "status": "pass",
                        "time_ms": 1.0}])
    appender.write(complete.run)  # type: ignore[arg-type]
    appender.write({"type": "env", "env": complete.envs[0]})
    appender.write({"type": "problem", **complete.problems["K+mm"]})
    appender.close()
    out = tmp_path / "t.json"
    assert cli(["tune", "table", str(results), "-o", str(out), "--check"]) == 1  # no winner
    assert json.loads(out.read_text())["table"] == {}
    appender = records.Appender(results)
    appender.write({"type": "result", **complete.results["a"]})
    appender.close()
    assert cli(["tune", "table", str(results), "-o", str(out), "--check"]) == 0
    kept = out.read_bytes()
    other = tmp_path / "other.jsonl"
    other.write_text('{"type": "result", "task": "x", "status": "pass"}\n')
    capsys.readouterr()
    assert cli(["tune", "table", str(other), "-o", str(out)]) == 2
    assert "not a results file" in capsys.readouterr().err and out.read_bytes() == kept
    assert cli(["tune", "table", str(tmp_path / "missing.jsonl"), "-o", str(out)]) == 2
    assert out.read_bytes() == kept


def test_run_refuses_results_of_another_problems_file(problems_file: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    results = tmp_path / "r.jsonl"
    results.write_text('{"type": "run", "problems_sha256": "abc", "job": {"id": "other"}}\n')
    before = results.read_bytes()
    assert cli(["tune", "run", str(problems_file), "-o", str(results)]) == 2
    assert "another problems file" in capsys.readouterr().err
    assert results.read_bytes() == before


# -- the converter's choices handler, in-process --------------------------------------------

@pytest.fixture
def restore_inductor():
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.choices import InductorChoices
    from torch._inductor.virtualized import V

    names = ("inductor_choices_class", "max_autotune_gemm", "max_autotune_gemm_backends",
             "fx_graph_cache", "compile_threads")
    inductor_config.compile_threads = inductor_config.compile_threads
    saved = {n: getattr(inductor_config, n) for n in names}
    lazy = functorch_config.force_non_lazy_backward_lowering
    yield
    for n, v in saved.items():
        setattr(inductor_config, n, v)
    functorch_config.force_non_lazy_backward_lowering = lazy
    V.set_choices_handler(InductorChoices())


def _compile_bmm(factory: Any) -> int:
    import torch
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    from titan_rocm.tuned_gemms.choices import install

    inductor_config.fx_graph_cache = False
    inductor_config.compile_threads = 1  # also un-hides it if another test deleted it
    install(factory)
    torch._dynamo.reset()
    counters.clear()
    a, b = torch.randn(2, 8, 16), torch.randn(2, 16, 4)
    out = torch.compile(lambda x, y: torch.bmm(x, y))(a, b)
    assert torch.allclose(out, torch.bmm(a, b), atol=1e-5)
    return int(counters["inductor"]["select_algorithm_autotune"])


KEY = "((torch.float32, [2, 8, 16], [128, 16, 1]), (torch.float32, [2, 16, 4], [64, 4, 1]))+bmm"


def test_converter_hit_gives_one_choice_and_a_miss_aten_only(restore_inductor: None) -> None:
    from titan_rocm.tuned_gemms.choices import ChoicesFactory, LookupStats, TableChoices

    seen: list[int] = []

    class Counting(TableChoices):
        def finish(self, lowering, problem, choices, input_nodes, layout):  # noqa: ANN001
            kept = super().finish(lowering, problem, choices, input_nodes, layout)
            seen.append(len(kept))
            return kept

    stats = LookupStats()
    hit = {f"{ROCM_KEY}+{KEY}": [{"template_id": "aten::bmm"}]}
    make = ChoicesFactory(lambda: Counting(hit, "sha-a", stats, device_key=ROCM_KEY))
    assert _compile_bmm(make) == 0
    assert seen == [1] and stats.to_dict()["hits"] == 1 and stats.to_dict()["misses"] == 0
    make = ChoicesFactory(lambda: Counting({"other+bmm": [{"template_id": "aten::bmm"}]},
                                           "sha-b", stats, device_key=ROCM_KEY))
    assert _compile_bmm(make) == 0
    assert seen == [1, 1] and stats.to_dict()["misses"] == 1
    assert stats.to_dict()["missed_keys"] == [KEY]


def test_miss_keeps_only_the_aten_kernel_among_templates() -> None:
    from titan_rocm.tuned_gemms.choices import Lowering, TableChoices
    from titan_rocm.tuned_gemms.problems import Call

    class Template:
        def __init__(self, uid: str) -> None:
            self.uid = uid

    class Extern(Template):
        pass

    import titan_rocm.tuned_gemms.choices as choices_module

    real = choices_module.is_extern
    choices_module.is_extern = lambda t: isinstance(t, Extern)  # type: ignore[assignment]
    try:
        handler = TableChoices({}, "sha", choices_module.LookupStats(), device_key=ROCM_KEY)
        templates = [Extern("aten::mm"), Template("triton::mm")]
        offered = {"aten::mm": iter(["ATEN"]), "triton::mm": iter(["T1", "T2"])}
        picked = handler.choose(Lowering(op="mm"), Call("K+mm", (), ()), offered, None,
                                templates, "mm", None)
    finally:
        choices_module.is_extern = real
    assert picked == ["ATEN"]


def test_uuid_is_the_table_files_hash(tmp_path: Path) -> None:
    from titan_rocm.tuned_gemms.choices import LookupStats, TableChoices

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"meta": {}, "table": {"k": [{"template_id": "aten::mm"}]}}))
    first = table.read(path)
    path.write_text(json.dumps({"meta": {}, "table": {"k": [{"template_id": "aten::bmm"}]}}))
    second = table.read(path)
    uuids = {TableChoices(t.table, t.sha256, LookupStats()).uuid() for t in (first, second)}
    assert len(uuids) == 2


def test_workaround_refuses_a_table_for_another_device(tmp_path: Path) -> None:
    from titan_rocm.settings import RocmSettings
    from titan_rocm.workarounds.base import CompileSettings, Context
    from titan_rocm.workarounds.gemm_lookup.workaround import GemmLookup

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"meta": {"device_key": ROCM_KEY, "torch": "2.11.0"},
                                "table": {}}))

    def make(mode: str, table_path: str) -> GemmLookup:
        settings = RocmSettings(gemm_lookup=mode, gemm_lookup_table=table_path)
        return GemmLookup(Context(settings=settings, compile=CompileSettings(enable=True)))

    auto = make("auto", str(path))
    reason = auto.gate(None)  # type: ignore[arg-type]
    assert reason and "another device or software" in reason and "device_key" in reason
    with pytest.raises(ValueError, match='gemm_lookup = "on" cannot apply'):
        make("on", str(path)).require()
    assert "no table named" in (make("auto", "").gate(None) or "")  # type: ignore[arg-type]
    garbled = tmp_path / "bad.json"
    garbled.write_text("{")
    assert "not JSON" in (make("auto", str(garbled)).gate(None) or "")  # type: ignore[arg-type]


# -- tune run: processes, faults, resume (slow: real minesweepers) --------------------------

FAULTS = ("nan:aten::bmm@0,wrong:cpp::bmm@0,crash:aten::bmm@1,raise:aten::bmm@2,"
          "hang:cpp::bmm@2")


@pytest.mark.slow
def test_each_fault_gets_its_result_and_none_is_selected(problems_file: Path,
                                                         tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    done = _tune(problems_file, out, TITAN_ROCM_TUNE_FAULTS=FAULTS)
    assert done.returncode == 0, done.stderr[-3000:]
    by = {(r["template_id"], r["key"]): r for r in _results(out)}
    keys = [p.key for p in problems.read(problems_file).problems]
    assert by[("aten::bmm", keys[0])]["status"] == "nan"
    assert by[("cpp::bmm", keys[0])]["status"] == "mismatch"
    crash = by[("aten::bmm", keys[1])]
    assert crash["status"] == "crash" and crash["signal"] == "SIGSEGV"
    raised = by[("aten::bmm", keys[2])]
    assert raised["status"] == "compile_error" and "fault injection" in raised["error"]
    hang = by[("cpp::bmm", keys[2])]
    assert hang["status"] == "hang" and 2.0 <= hang["elapsed_s"] <= 3.0
    # The candidate after the crash ran in a new minesweeper.
    started = [r for r in records.read_records(out)[0] if r["type"] == "started"]
    crash_pid = next(r["pid"] for r in started if r["task"] == crash["task"])
    after = [r["pid"] for r in started][[r["task"] for r in started].index(crash["task"]) + 1]
    assert after != crash_pid
    built = table.build(records.load_state(out))
    assert built.table == {}  # every ATen kernel faulted: no problem has a validated winner


@pytest.mark.slow
def test_kill_9_then_resume_runs_nothing_finished_again(problems_file: Path,
                                                         tmp_path: Path) -> None:
    whole = tmp_path / "whole.jsonl"
    assert _tune(problems_file, whole).returncode == 0
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "titan_rocm.cli", "tune", "run", str(problems_file), "-o",
           str(out), "--backends", "ATEN,CPP", "--timeout", "60"]
    # The first problem's second candidate hangs: the kill lands in the middle of a problem.
    env = _env(tmp_path, TITAN_ROCM_TUNE_FAULTS="hang:cpp::bmm@0")
    proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not any(
            r["type"] == "started" and r["template_id"] == "cpp::bmm"
            for r in records.read_records(out)[0]):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {r["task"] for r in _results(out)}
    assert len(before) == 1  # the first problem's ATen kernel
    started_before = len([r for r in records.read_records(out)[0] if r["type"] == "started"])
    assert _tune(problems_file, out).returncode == 0
    after = records.read_records(out)[0]
    started_after = [r["task"] for r in after if r["type"] == "started"][started_before:]
    assert not set(started_after) & before  # nothing finished ran again
    assert len({r["task"] for r in _results(out)}) == 5
    assert table.build(records.load_state(out)).table == \
        table.build(records.load_state(whole)).table


# -- tune collect: TorchTitan 0.2.2's own train loop, one step, on CPU ----------------------

COLLECT = ["--trainer", "tests.support.tune_trainer:CompiledCpuTrainer",
           "--job.custom_config_module", "titan_rocm.config", "--model.name", "llama3",
           "--model.flavor", "debugmodel",
           "--training.local_batch_size", "2", "--training.seq_len", "32",
           "--lr_scheduler.warmup_steps", "1", "--metrics.log_freq", "10"]


def _collect(tmp_path: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "titan_rocm.cli", "tune", "collect", "-o", str(out),
           *COLLECT, "--job.dump_folder", str(tmp_path / "dump"), *flags]
    return subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)


@pytest.mark.slow
def test_collect_records_forward_and_backward_gemms(tmp_path: Path) -> None:
    out = tmp_path / "problems.jsonl"
    done = _collect(tmp_path, out, "--compile.enable")
    assert done.returncode == 0, done.stderr[-3000:]
    found = problems.read(out)
    assert found.job["model"] == "llama3" and found.job["flavor"] == "debugmodel"
    assert found.settings["gemm_lookup"] == "off"  # the step never uses a table
    assert {p.op for p in found.problems} == {"mm"}
    # A linear's forward, its input gradient and its weight gradient are three problems.
    assert len(found.problems) >= 6 and sum(p.count for p in found.problems) >= 3 * 6
    assert all(t.uid == "aten::mm" for p in found.problems for c in p.calls for t in c.templates)


@pytest.mark.slow
def test_collect_refuses_a_job_that_compiles_nothing(tmp_path: Path) -> None:
    out = tmp_path / "problems.jsonl"
    done = _collect(tmp_path, out, "--compile.no-enable")
    assert done.returncode == 2 and "nothing to tune" in done.stderr and not out.exists()


@pytest.mark.parametrize("reader", ["problems", "table", "records"])
def test_tune_readers_refuse_a_fifo_without_blocking(tmp_path: Path, reader: str) -> None:
    import signal

    from titan_rocm.tuned_gemms import problems as problems_module
    from titan_rocm.tuned_gemms import records as records_module
    from titan_rocm.tuned_gemms import table as table_module

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    read, error = {
        "problems": (problems_module.read, problems_module.ProblemsError),
        "table": (table_module.read, table_module.LookupTableError),
        "records": (records_module.read_records, records_module.ResultsError),
    }[reader]

    def blocked(*_: object) -> None:
        raise AssertionError(f"{reader} reader blocked on a FIFO")

    old = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(5)
    try:
        with pytest.raises(error, match="named pipe"):
            read(fifo)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
