"""Shared fixtures: the GPU marker, the fake aiter (MLA tests), the two TorchTitan suites.

Two suites share this tree: ``tests/tt030/`` is the TorchTitan 0.3.0 suite (marker
``torchtitan030``), everything else the TorchTitan 0.2.2 suite (marker ``torchtitan022``).
Which TorchTitan is installed is read from its files' API, never by importing it (0.3.0
fixes its device type when first imported). The other suite's test modules are not even
imported: each becomes one test skipped with the reason, so ``pytest -q`` in either
environment says what it left out, and ``-m torchtitan030`` / ``-m torchtitan022`` selects
one suite.

Two more things every test run gets here: the Hypothesis profile (no wall-clock deadline, see
:data:`HYPOTHESIS_PROFILE`) and ``--random-order`` (modules, then the tests in each module, in
a seeded random order; ``scripts/random_order.sh`` runs the suite so twice).
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.support.mla_test_support import clean_mla_state, fake_aiter, fake_aiter_path  # noqa: F401
from titan_rocm import torchtitan_version

TT030_SUITE = Path(__file__).resolve().parent / "tt030"
SUITES = {"0.2": ("torchtitan022", "0.2.2"), "0.3": ("torchtitan030", "0.3.0")}
"""TorchTitan release line -> (its marker, the version its suite is written for)."""
INSTALLED = torchtitan_version.installed()
INSTALLED_SERIES = torchtitan_version.series()
"""The installed TorchTitan's API (its files, not its version string: main says 0.2.2 and has
0.3's API); None when none is installed."""


HYPOTHESIS_PROFILE = "titan-rocm"
"""No per-example deadline. Hypothesis times examples and their generation by the wall clock;
on a shared two-core machine a test's process waits for a core, so the default 200 ms deadline
and the too_slow health check's budget (5 x the deadline: 1 s of drawing for the first
examples) failed tests whose strategies are cheap (test_routing's, about 1 ms of drawing an
example when idle). Without a deadline that budget is Hypothesis's 30 s, which only a truly
heavy strategy reaches. ``HYPOTHESIS_PROFILE=default`` puts Hypothesis's own defaults back."""
settings.register_profile(HYPOTHESIS_PROFILE, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", HYPOTHESIS_PROFILE))


def suite_of(path: Path) -> str:
    """The TorchTitan release line whose suite the test file ``path`` belongs to."""
    return "0.3" if TT030_SUITE in Path(path).resolve().parents else "0.2"


class OtherSuiteModule(pytest.File):
    """A test module of the suite for the TorchTitan that is not installed: not imported."""

    def collect(self):  # noqa: D102 - pytest protocol
        series = suite_of(self.path)
        marker, version = SUITES[series]
        installed = f"torchtitan {INSTALLED}" if INSTALLED else "no torchtitan"
        item = OtherSuiteItem.from_parent(self, name=self.path.name)
        item.add_marker(getattr(pytest.mark, marker))
        item.add_marker(pytest.mark.skip(
            reason=f"TorchTitan {version} suite; this environment has {installed} "
            "(README: the test command runs each suite in its own venv)"
        ))
        yield item


class OtherSuiteItem(pytest.Item):
    """Stands for a whole module of the other suite; always skipped."""

    def runtest(self) -> None:  # noqa: D102 - never runs (skip marker)
        pytest.skip("other TorchTitan suite")

    def reportinfo(self):  # noqa: D102 - pytest protocol
        return self.path, 0, self.name


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector):
    """Keep the other suite's modules unimported (each imports its own TorchTitan)."""
    if INSTALLED_SERIES is None and suite_of(module_path) == "0.2":
        return None  # nothing installed: let the 0.2.2 suite fail loudly as it always did
    if suite_of(module_path) != INSTALLED_SERIES:
        return OtherSuiteModule.from_parent(parent, path=module_path)
    return None


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--random-order", metavar="SEED", default=None,
        help="run the test modules, and the tests inside each, in a random order drawn from "
        "SEED (an integer, or 'any' for a fresh one); the header names the seed to repeat it",
    )
    parser.addoption(
        "--state-leaks", action="store_true",
        help="report each test that leaves torch's, Dynamo's or Inductor's global settings or "
        "the environment changed (tests/support/state_leaks.py)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Under ``--state-leaks``, the settings ``item`` (setup, call, teardown) left changed."""
    if not item.config.getoption("--state-leaks"):
        return (yield)
    from tests.support import state_leaks

    before = state_leaks.fingerprint()
    result = yield
    changed = state_leaks.differences(before, state_leaks.fingerprint())
    if changed:
        item.config.stash.setdefault(LEAKS, {})[item.nodeid] = changed
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:  # at once too: a run cut short still names what it found
            reporter.write_line(f"state leak: {item.nodeid}: {'; '.join(changed)}")
    return result


LEAKS = pytest.StashKey[dict[str, list[str]]]()
"""nodeid -> what that test left changed (``--state-leaks``)."""


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    seed = random_order_seed(config)
    if seed is not None:  # the header is gone under -q: a failing order must still be repeatable
        terminalreporter.write_line(f"random order: seed {seed} (again: --random-order {seed})")
    if not config.getoption("--state-leaks"):
        return
    leaks = config.stash.get(LEAKS, {})
    terminalreporter.section(f"state leaks: {len(leaks)} test(s) left process state changed")
    for nodeid, changed in leaks.items():
        terminalreporter.line(nodeid)
        for line in changed:
            terminalreporter.line(f"    {line}")


def random_order_seed(config: pytest.Config) -> int | None:
    """The ``--random-order`` seed (drawn once per run for ``any``); None without the option."""
    value = config.getoption("--random-order")
    if value is None:
        return None
    if not hasattr(config, "_titan_rocm_seed"):
        if value == "any":
            config._titan_rocm_seed = random.SystemRandom().randrange(2**32)
        else:
            try:
                config._titan_rocm_seed = int(value)
            except ValueError:
                raise pytest.UsageError(
                    f"--random-order {value} is not valid; accepted: an integer seed or 'any'"
                ) from None
    return config._titan_rocm_seed


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = random_order_seed(config)
    return None if seed is None else f"random order: seed {seed} (again: --random-order {seed})"


def shuffled(items: list[pytest.Item], seed: int) -> list[pytest.Item]:
    """``items`` with their modules in a random order, and each module's tests in a random
    order (a module stays together: its module-scoped fixtures are built once)."""
    rng = random.Random(seed)
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    groups = list(modules.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    return [item for group in groups for item in group]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its TorchTitan suite; skip GPU-marked tests, with the reason,
    where the machine has no GPU; shuffle under ``--random-order``."""
    gpu = _has_gpu()
    for item in items:
        item.add_marker(getattr(pytest.mark, SUITES[suite_of(item.path)][0]))
        if item.get_closest_marker("gpu") is not None and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA or ROCm GPU; none here"))
    seed = random_order_seed(config)
    if seed is not None:
        items[:] = shuffled(items, seed)


_FLAVOR_MODELS = ("llama3", "deepseek_v3", "qwen3", "llama4")


@pytest.fixture(autouse=True)
def _registered_flavors_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each 0.2.2 test sees copies of TorchTitan's registered flavor args.

    TorchTitan 0.2.2's ``Trainer.__init__`` calls ``update_from_config`` on the registered
    flavor itself, which on a CPU turns MoE grouped MM off (no SM90): one test that builds a
    trainer in process (the numerics audit's, the fault's) made every later ``plan`` of a
    deepseek_v3 job see ``use_grouped_mm = false`` and skip ``rocm.grouped_mm``.
    """
    if INSTALLED_SERIES != "0.2":
        return
    import copy

    from torchtitan.protocols.train_spec import get_train_spec

    for name in _FLAVOR_MODELS:
        try:
            registry = get_train_spec(name).model_args
        except (ValueError, KeyError, ImportError):
            continue
        for flavor, args in list(registry.items()):
            monkeypatch.setitem(registry, flavor, copy.deepcopy(args))


TORCHTITAN_DYNAMO_SETTINGS = ("capture_scalar_outputs",
                              "skip_fwd_side_effects_in_bwd_under_checkpoint")
"""Dynamo settings TorchTitan's compile sets for the whole process and never puts back
(0.2.2's ``apply_compile``: the first; 0.3.0's ``torchtitan/distributed/compile.py``: both)."""


def _torchtitan_compile_globals() -> dict[str, Any]:
    # What a compiled TorchTitan trainer changes for the whole process and never puts back:
    # the MoE module's functions (tests/support/state_leaks.py) and Dynamo's settings above.
    import torch._dynamo.config as dynamo_config

    from tests.support.state_leaks import torchtitan_functions

    return {"dynamo": {name: getattr(dynamo_config, name)
                       for name in TORCHTITAN_DYNAMO_SETTINGS if hasattr(dynamo_config, name)},
            "functions": torchtitan_functions()}


def _put_back_torchtitan_compile_globals(held: dict[str, Any]) -> None:
    import torch._dynamo.config as dynamo_config

    for name, value in held["dynamo"].items():
        if getattr(dynamo_config, name) != value:
            setattr(dynamo_config, name, value)
    for name, functions in held["functions"].items():
        module = sys.modules[name]
        for key, value in functions.items():
            if getattr(module, key, None) is not value:
                setattr(module, key, value)


@pytest.fixture(autouse=True)
def _process_state_put_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """What a test leaves in the process is put back before the next one: titan-rocm patches it
    installed and never released (a trainer built and not closed, a tuned-GEMM handler
    installed outside a job), a gloo group a trainer started, torchrun's variables the CPU
    trainer set. Under ``--state-leaks`` nothing is put back, so the report names the test.
    """
    import torch.distributed as dist

    from titan_rocm import patches

    if request.config.getoption("--state-leaks"):
        yield
        return
    held = {id(p) for p in patches.installed()}
    environ = dict(os.environ)
    started = dist.is_available() and dist.is_initialized()
    compile_globals = _torchtitan_compile_globals()
    yield
    _put_back_torchtitan_compile_globals(compile_globals)
    for p in reversed(patches.installed()):
        if id(p) not in held:
            p.restore()
    if dist.is_available() and dist.is_initialized() and not started:
        dist.destroy_process_group()
    for name in set(os.environ) - set(environ) - {"PYTEST_CURRENT_TEST"}:
        del os.environ[name]
    for name, value in environ.items():
        if os.environ.get(name) != value and name != "PYTEST_CURRENT_TEST":
            os.environ[name] = value
