"""Reaching compile workers: the sitecustomize bootstrap, the exported environment, and the
stats workers report back. Children are real interpreters started like Inductor starts its
compile workers: the parent's environment, with ``PYTHONPATH`` = the parent's ``sys.path``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from titan_rocm.workarounds.triton_war import bootstrap, stats

TESTS_DIR = str(Path(__file__).resolve().parents[3])


def child_env(tmp_path, *, exported: bool = True, rule: str = "precise") -> tuple[dict, str]:
    """An environment like Inductor's worker gets, after the converter exported (or not)."""
    env = dict(os.environ)
    for key in (bootstrap.ENV_ENABLE, bootstrap.ENV_RULE, bootstrap.ENV_STRICT,
                bootstrap.ENV_STATS_DIR, "AMDGCN_USE_BUFFER_OPS"):
        env.pop(key, None)
    path = [p for p in sys.path if p != bootstrap.boot_dir()]
    if TESTS_DIR not in path:
        path.insert(0, TESTS_DIR)
    stats_dir = str(tmp_path / "stats")
    os.makedirs(stats_dir, exist_ok=True)
    if exported:
        bootstrap.export(rule, False, stats_dir, environ=env, path=path)
    env["PYTHONPATH"] = os.pathsep.join(path)  # what Inductor hands its workers
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    return env, stats_dir


def run_child(code: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_export_sets_variables_and_puts_boot_dir_first():
    env = {"PYTHONPATH": "/a:/b", "TORCH_CUSTOM_PYTHONPATH": "/c"}
    path = ["/x", "/y"]
    values = bootstrap.export("conservative", True, "/stats", environ=env, path=path)
    here = bootstrap.boot_dir()
    assert path[0] == here
    assert env["PYTHONPATH"] == os.pathsep.join([here, "/a", "/b"])
    assert env["TORCH_CUSTOM_PYTHONPATH"] == os.pathsep.join([here, "/c"])
    assert env[bootstrap.ENV_ENABLE] == "1" and env[bootstrap.ENV_RULE] == "conservative"
    assert env[bootstrap.ENV_STRICT] == "1" and env[bootstrap.ENV_STATS_DIR] == "/stats"
    assert values[bootstrap.ENV_ENABLE] == "1"
    bootstrap.export("precise", False, None, environ=env, path=path)  # idempotent
    assert path.count(here) == 1 and env["PYTHONPATH"].count(here) == 1
    bootstrap.unexport(environ=env, path=path)
    assert path == ["/x", "/y"]
    assert env == {"PYTHONPATH": "/a:/b", "TORCH_CUSTOM_PYTHONPATH": "/c"}
    assert os.path.isfile(os.path.join(here, "sitecustomize.py"))


@pytest.mark.parametrize(
    ("env", "match"),
    [({bootstrap.ENV_RULE: "naive"}, "naive"), ({bootstrap.ENV_STRICT: "yes"}, "'yes'")],
)
def test_settings_from_env_rejects_bad_values(env, match):
    with pytest.raises(ValueError, match=match):
        bootstrap.settings_from_env(env)
    assert bootstrap.settings_from_env({}) == ("precise", False)


def test_bootstrap_is_lazy_and_never_loads_torchtitan(tmp_path):
    env, _ = child_env(tmp_path)
    result = run_child("""
        import json, sys
        heavy = ("torch", "triton", "torchtitan")
        at_start = [m for m in heavy if m in sys.modules]
        import triton  # the bootstrap installs the wrapper right after this
        from titan_rocm.workarounds.triton_war import compile_hook
        print(json.dumps({"at_start": at_start, "torchtitan": "torchtitan" in sys.modules,
                          "bound": compile_hook.bound_sites()}))
    """, env)
    assert result["at_start"] == []
    assert result["torchtitan"] is False
    assert all(result["bound"].values()), result


def test_bootstrap_does_nothing_when_unset(tmp_path):
    env, _ = child_env(tmp_path)
    env.pop(bootstrap.ENV_ENABLE)
    result = run_child("""
        import json, sys
        loaded = "titan_rocm" in sys.modules
        import triton
        print(json.dumps({"titan_rocm_at_start": loaded,
                          "wrapped": hasattr(triton.compile, "__titan_rocm_triton_war__")}))
    """, env)
    assert result == {"titan_rocm_at_start": False, "wrapped": False}


CHILD_COMPILE = """
    import json
    from tests.support import triton_war_hook_kernels as k
    r = k.compile_in_worker("scale", 2048)
    print(json.dumps(r))
"""


def test_child_with_exported_env_installs_wrapper_and_reports_stats(tmp_path):
    env, stats_dir = child_env(tmp_path)
    result = run_child(CHILD_COMPILE, env)
    assert result["bound"] and all(result["bound"].values())
    assert result["pid"] != os.getpid()
    merged = stats.collect(stats_dir)
    assert merged.processes == 1
    assert (merged.scanned, merged.hazardous, merged.residual) == (1, 0, 0)
    assert any(str(result["pid"]) in name for name in os.listdir(stats_dir))


def test_child_without_exported_env_does_not_see_the_wrapper(tmp_path):
    """The failure the bootstrap exists for: a wrapper installed only in the parent."""
    pytest.importorskip("triton")
    from titan_rocm.workarounds.triton_war import compile_hook

    compile_hook.install()
    try:
        env, stats_dir = child_env(tmp_path, exported=False)
        result = run_child(CHILD_COMPILE, env)
    finally:
        compile_hook.uninstall()
    assert result["bound"] is None
    assert os.listdir(stats_dir) == []


def test_shadowed_sitecustomize_still_runs(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    marker = "import os\nos.environ['OTHER_SITECUSTOMIZE'] = 'ran'\n"
    (other / "sitecustomize.py").write_text(marker)
    env, _ = child_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([bootstrap.boot_dir(), str(other), env["PYTHONPATH"]])
    result = run_child("""
        import json, os, sys
        print(json.dumps({"other": os.environ.get("OTHER_SITECUSTOMIZE"),
                          "hook": any(getattr(f, "module_name", None) == "triton"
                                      for f in sys.meta_path)}))
    """, env)
    assert result == {"other": "ran", "hook": True}


@pytest.mark.slow
def test_inductor_compile_worker_pool_has_the_wrapper(tmp_path, monkeypatch):
    """Inductor's own SubprocPool (compile_worker/__main__.py), started after export()."""
    pytest.importorskip("torch._inductor.compile_worker.subproc_pool")
    from torch._inductor.compile_worker.subproc_pool import SubprocPool

    import tests.support.triton_war_hook_kernels as k

    stats_dir = tmp_path / "stats"
    stats_dir.mkdir()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    saved_path = list(sys.path)
    saved_env = {key: os.environ.get(key) for key in (
        "PYTHONPATH", "TORCH_CUSTOM_PYTHONPATH", bootstrap.ENV_ENABLE, bootstrap.ENV_RULE,
        bootstrap.ENV_STRICT, bootstrap.ENV_STATS_DIR)}
    bootstrap.export("precise", False, str(stats_dir))
    try:
        pool = SubprocPool(1)
        try:
            result = pool.submit(k.compile_in_worker, "scale", 2048).result(timeout=180)
        finally:
            pool.shutdown()
    finally:
        sys.path[:] = saved_path
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert result["pid"] != os.getpid()
    assert result["bound"] and all(result["bound"].values())
    merged = stats.collect(stats_dir)
    assert merged.scanned == 1 and merged.processes == 1


# ----------------------------------------------------------------------------- stats


def test_stats_merge_counts_and_names(tmp_path, monkeypatch):
    monkeypatch.setenv(stats.ENV_STATS_DIR, str(tmp_path))
    stats.reset_local()
    try:
        stats.record(stats.CLEAN, "a")
        stats.record(stats.PATCHED, "b")
        stats.record(stats.RESIDUAL, "c")
        stats.record(stats.SKIPPED_NON_HIP, "d")
        (tmp_path / "otherhost-1.jsonl").write_text(
            json.dumps({"outcome": "patched", "kernel": "b"}) + "\n" + '{"outcome": "pat\n')
        merged = stats.collect()
    finally:
        stats.reset_local()
    assert merged.processes == 2
    assert (merged.scanned, merged.hazardous, merged.patched, merged.residual) == (4, 3, 2, 1)
    assert merged.skipped_non_hip == 1 and merged.compiled == 5
    assert merged.names["patched"] == ["b"] and merged.names["residual"] == ["c"]
    assert merged.bad_lines == 1


def test_stats_reject_unknown_outcome_and_missing_dir(tmp_path, capsys):
    with pytest.raises(ValueError, match="'exploded'"):
        stats.Stats().add("exploded", "k")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        stats.collect(tmp_path / "nope")
    assert stats.main([str(tmp_path / "nope")]) == 2
    assert stats.main([str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["processes"] == 0


def test_boot_dir_ships_in_the_wheel():
    """``_boot`` has no __init__.py; setuptools must find it as a namespace package (the
    default with pyproject configuration) or ``pip install .`` would drop sitecustomize.py."""
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = pytest.importorskip("setuptools")

    repo = Path(TESTS_DIR).parent
    find = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]
    assert find.get("namespaces", True) is True
    found = setuptools.find_namespace_packages(where=str(repo), include=find["include"])
    assert "titan_rocm.workarounds.triton_war._boot" in found
