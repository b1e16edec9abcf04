"""The test suite's own setup: what a plain ``pytest`` runs, what README's test command (and
so CI) runs, the random order of ``--random-order`` and ``scripts/random_order.sh``, and the
Hypothesis profile (docs/testing.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import settings

from tests import conftest

REPO = Path(__file__).resolve().parents[2]


def _readme_test_command() -> str:
    readme = (REPO / "README.md").read_text()
    commands = [line for line in readme.splitlines()
                if line.startswith("python3 -m venv .venv") and "test_suites.sh" in line]
    assert len(commands) == 1, commands
    return commands[0]


def test_a_plain_pytest_leaves_the_slow_tests_out(pytestconfig: pytest.Config) -> None:
    addopts = pytestconfig.getini("addopts")  # pyproject's, as pytest read it
    assert addopts[addopts.index("-m") + 1] == "not slow"


def test_readme_runs_every_test_of_both_suites_and_ci_runs_readme() -> None:
    """README's command ends in scripts/test_suites.sh, whose three pytest runs are each
    suite's marker (which replaces the plain run's ``-m 'not slow'``: slow tests run too), the
    0.2.2 suite dealt into one folder and everything but that folder."""
    command = _readme_test_command()
    assert command.endswith("&& scripts/test_suites.sh")
    script = (REPO / "scripts" / "test_suites.sh").read_text()
    runs = dict(re.findall(r'^  \[([\w-]+)\]="(.+)"$', script, re.M))
    assert runs == {
        "tt022-numerics": ".venv/bin/python -m pytest -q -m torchtitan022 tests/unit/numerics",
        "tt022-rest": ".venv/bin/python -m pytest -q -m torchtitan022 --ignore=tests/unit/numerics",
        "tt030": ".venv030/bin/python -m pytest -q -m torchtitan030"}
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert ci[-1] == command


def _item(path: str, name: str) -> SimpleNamespace:
    return SimpleNamespace(path=Path(path), name=name)


def test_random_order_keeps_modules_together_and_repeats_by_seed() -> None:
    items = [_item(f"m{m}.py", f"t{t}") for m in range(6) for t in range(5)]
    first, again = conftest.shuffled(items, 7), conftest.shuffled(items, 7)
    assert [id(i) for i in first] == [id(i) for i in again]
    assert sorted(map(id, first)) == sorted(map(id, items))
    modules = [i.path for i in first]
    assert all(modules.count(p) == 5 for p in set(modules))
    runs = [p for n, p in enumerate(modules) if n == 0 or modules[n - 1] != p]
    assert len(runs) == 6  # each module's tests run one after another
    orders = {tuple((i.path, i.name) for i in conftest.shuffled(items, s)) for s in range(5)}
    assert len(orders) == 5
    assert {tuple(i.name for i in first if i.path == p) for p in set(modules)} != {
        tuple(f"t{t}" for t in range(5))}  # inside a module too


def _config(value: str | None) -> SimpleNamespace:
    return SimpleNamespace(getoption=lambda name: value)


def test_random_order_seed_any_is_drawn_once_and_bad_seeds_are_named() -> None:
    assert conftest.random_order_seed(_config(None)) is None
    assert conftest.random_order_seed(_config("42")) == 42
    config = _config("any")
    assert conftest.random_order_seed(config) == conftest.random_order_seed(config)
    with pytest.raises(pytest.UsageError, match="--random-order soon is not valid; "
                       "accepted: an integer seed or 'any'"):
        conftest.random_order_seed(_config("soon"))


def test_hypothesis_runs_without_a_wall_clock_deadline() -> None:
    """A busy machine's waits must not fail a test whose strategies are cheap."""
    assert os.environ.get("HYPOTHESIS_PROFILE", conftest.HYPOTHESIS_PROFILE) == \
        conftest.HYPOTHESIS_PROFILE
    assert settings.default.deadline is None


def _fake_python(tmp_path: Path, rcs: list[int]) -> Path:
    """A python that records its arguments and ends like pytest, exiting with ``rcs`` in turn."""
    fake = tmp_path / "python"
    calls = tmp_path / "calls"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {calls}\n'
        f"n=$(wc -l < {calls})\n"
        f"rcs=({' '.join(map(str, rcs))})\n"
        'echo "3 passed, 2 deselected in 0.1s"\n'
        'exit "${rcs[$((n - 1))]}"\n'
    )
    fake.chmod(0o755)
    return fake


def _random_order(tmp_path: Path, rcs: list[int], *args: str,
                  seeds: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHON=str(_fake_python(tmp_path, rcs)))
    env.pop("RANDOM_ORDER_SEEDS", None)
    if seeds is not None:
        env["RANDOM_ORDER_SEEDS"] = seeds
    return subprocess.run(["bash", str(REPO / "scripts" / "random_order.sh"), *args],
                          env=env, capture_output=True, text=True, timeout=60)


def test_random_order_script_runs_twice_with_two_seeds(tmp_path: Path) -> None:
    done = _random_order(tmp_path, [0, 0], "tests/unit", "-x")
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    seeds = [call.split()[4] for call in calls]
    assert [call.split()[:4] for call in calls] == [["-m", "pytest", "-q", "--random-order"]] * 2
    assert all(call.split()[5:] == ["tests/unit", "-x"] for call in calls)
    assert seeds[0] != seeds[1] and all(s.isdigit() for s in seeds)
    assert done.stdout.splitlines()[-2:] == [
        f"random order: seed {s}: 3 passed, 2 deselected (pytest exit 0)" for s in seeds]


def test_random_order_script_fails_with_the_first_failing_run(tmp_path: Path) -> None:
    done = _random_order(tmp_path, [0, 1], seeds="5 9")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-2:] == [
        "random order: seed 5: 3 passed, 2 deselected (pytest exit 0)",
        "random order: seed 9: 3 passed, 2 deselected (pytest exit 1)"]


def test_random_order_script_names_bad_seeds(tmp_path: Path) -> None:
    done = _random_order(tmp_path, [0, 0], seeds="5")
    assert done.returncode == 2 and not (tmp_path / "calls").exists()
    assert done.stderr == ("random_order: RANDOM_ORDER_SEEDS='5' is not valid; accepted: two "
                           "integers, e.g. '1 2'\n")


def test_a_real_random_order_run_says_its_seed(tmp_path: Path) -> None:
    """pytest itself with --random-order under -q (no header): the summary names the seed, and
    the order is the seed's."""
    seed = "11"
    tests, ran = tmp_path / "test_order.py", tmp_path / "ran.txt"
    tests.write_text("".join(f"def test_{n}():\n    open({str(ran)!r}, 'a').write('test_{n}\\n')\n"
                             for n in range(8)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]))
    done = subprocess.run(  # this repository's conftest, as a plugin, on a folder outside it
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest", "-q",
         "--random-order", seed, "--rootdir", str(tmp_path), str(tests)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    assert re.search(rf"^random order: seed {seed} \(again: --random-order {seed}\)$",
                     done.stdout, re.M), done.stdout[-2000:]
    items = [_item(str(tests), f"test_{n}") for n in range(8)]
    assert ran.read_text().split() == [i.name for i in conftest.shuffled(items, int(seed))]


def test_state_leaks_name_each_setting_a_test_left_changed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    import torch._dynamo.config  # loaded before the first fingerprint: its settings are read

    from tests.support.state_leaks import differences, fingerprint

    before = fingerprint()
    assert differences(before, fingerprint()) == []
    monkeypatch.setenv("TITAN_ROCM_LEAK_PROBE", "1")
    # Assigned back by hand: monkeypatch's undo deletes the entry from torch's config module,
    # and every later compile in the process then fails "capture_scalar_outputs does not exist".
    flag = torch._dynamo.config.capture_scalar_outputs
    was_set = "" if torch._dynamo.config._is_default("capture_scalar_outputs") else " (user-set)"
    dtype = torch.get_default_dtype()
    torch._dynamo.config.capture_scalar_outputs = not flag
    torch.set_default_dtype(torch.float64)
    try:
        after = fingerprint()
    finally:
        torch.set_default_dtype(dtype)
        torch._dynamo.config.capture_scalar_outputs = flag
    assert differences(before, after) == [
        "os.environ['TITAN_ROCM_LEAK_PROBE']: <unset> -> '1'",
        f"torch._dynamo.config.capture_scalar_outputs: {flag!r}{was_set} -> {not flag!r} "
        "(user-set)",
        f"torch.get_default_dtype(): {dtype!r} -> torch.float64",
    ]
    from titan_rocm import patches

    holder, base = type("Holder", (), {"value": 1}), fingerprint()
    patches.patch(holder, "value", lambda old: old + 1, by="leak_probe")
    try:
        (changed,) = differences(base, fingerprint())
        was, now = changed.removeprefix("titan_rocm.patches.installed(): ").split(" -> ")
        assert "by leak_probe" not in was and "Holder.value by leak_probe'" in now, changed
    finally:
        patches.restore(by="leak_probe")
    assert differences(base, fingerprint()) == []
    newly_loaded = {**before, "torch.some.config.knob": "1"}
    assert differences(before, newly_loaded) == []  # a module's defaults are no change
