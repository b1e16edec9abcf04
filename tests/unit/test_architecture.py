"""The import graph keeps the shape docs/architecture.md draws: no circles, adapters above
workarounds, workarounds on their own base, tools beside them.

Read from the source with ``ast`` (nothing is imported), every import statement counted,
those inside functions and under ``if TYPE_CHECKING:`` too: a name a module needs only for
its annotations still ties it to the module that defines it, and a circle of such ties is a
floor that stands on what stands on it.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "titan_rocm"

# The floors, lowest first. A module may import its own floor and those below.
FACTS = ("titan_rocm.archs", "titan_rocm.platform", "titan_rocm.settings", "titan_rocm.log",
         "titan_rocm.guard_message", "titan_rocm.audit_message", "titan_rocm._after_import",
         "titan_rocm.torchtitan_version",
         "titan_rocm.files", "titan_rocm.numbers", "titan_rocm.progress", "titan_rocm.measured",
         "titan_rocm.patches", "titan_rocm.serial", "titan_rocm.exit_codes")
WORKAROUNDS = "titan_rocm.workarounds"
SHARED_WORKAROUND_MODULES = {
    f"{WORKAROUNDS}.base", f"{WORKAROUNDS}.registry", f"{WORKAROUNDS}.moe_blocks",
    f"{WORKAROUNDS}.job", f"{WORKAROUNDS}.seams",
}
TOOLS = ("titan_rocm.logs", "titan_rocm.gemm_tables", "titan_rocm.numerics")
"""Tools beside the workarounds: platform facts only, never a workaround or an adapter. The
numerics audit among them: a workaround (``rocm.numerics_audit``) and the adapters run it,
handing it the step and the job's decisions; it never calls up."""
# Full module names, written out, so a move rewrites them by module path.
TUNING_LOOKUP = ("titan_rocm.tuned_gemms.problems", "titan_rocm.tuned_gemms.records",
                 "titan_rocm.tuned_gemms.table", "titan_rocm.tuned_gemms.env",
                 "titan_rocm.tuned_gemms.choices")
"""What training reads of the tuner (rocm.gemm_lookup stands on it): below the workarounds."""
TUNING_DRIVER = ("titan_rocm.tuner.collect", "titan_rocm.tuner.runner",
                 "titan_rocm.tuner.minesweeper", "titan_rocm.tuner.settings")
"""``titan-rocm tune``'s driver: a tool that may act as an adapter (its minesweeper builds
Contexts); ``collect`` records the step an adapter hands it."""
SCANNER = ("titan_rocm.scanner.amdgcn", "titan_rocm.scanner.hazards",
           "titan_rocm.scanner.scan", "titan_rocm.scanner.names")
"""The AMDGCN parser, rules and scanner behind ``titan-rocm scan``: no torch, no Triton."""
ADAPTERS = (
    "titan_rocm.adapters",  # tt022/ and tt030/, one folder per TorchTitan generation
    "titan_rocm.plan_format",  # both plans' printing
    # the paths users type (tests/unit/test_public_paths.py): shims of modules in adapters/
    # (titan_rocm.config, titan_rocm.train, titan_rocm.torchtitan.configs), the 0.3.0 names
    # (titan_rocm.torchtitan), and torchtitan/override.py, a real module
    "titan_rocm.torchtitan",
    "titan_rocm.config",
    "titan_rocm.train",
)
CLI = ("titan_rocm.cli",)
TEST_ONLY = ("titan_rocm.testing.faults", "titan_rocm.testing.graph_audit",
             "titan_rocm.testing.corrupt", "titan_rocm.testing.audit_matrix")
"""Code that exists for tests and worker processes; the runtime never imports it."""
TEST_ONLY_IMPORTERS = {
    # The minesweeper's worker processes inject the faults the tests ask for (env var).
    "titan_rocm.tuner.minesweeper",
    # `titan-rocm tune run` validates the fault spec of that env var before starting workers.
    "titan_rocm.cli.tune",
    # The results writer simulates the full disk a test asks for (TITAN_ROCM_TUNE_DISK_FULL_AFTER).
    "titan_rocm.tuner.runner",
    # `titan-rocm audit` puts the test fault into the job it audits (TITAN_ROCM_DEBUG_CORRUPT).
    "titan_rocm.cli.audit",
}
FORBIDDEN_IN_WORKAROUNDS = (
    "torchtitan.config",
    *ADAPTERS,
    "titan_rocm.tuner",
    "titan_rocm.cli",
    "titan_rocm.logs",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _in(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


def imports_of(name: str) -> set[str]:
    """Every module ``name`` imports (titan_rocm modules resolved, others as written)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in MODULES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    found.discard(name)
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def internal(name: str) -> set[str]:
    return {m for m in GRAPH[name] if m in MODULES}


def workaround_of(name: str) -> str | None:
    """The workaround package (or module) ``name`` belongs to; None for shared modules."""
    if not name.startswith(WORKAROUNDS + ".") or name in SHARED_WORKAROUND_MODULES:
        return None
    return ".".join(name.split(".")[:3])


def test_the_graph_was_read() -> None:
    assert "titan_rocm.workarounds.base" in GRAPH["titan_rocm.adapters.tt022.converters.converter"]
    assert len(MODULES) > 40


def test_no_import_circle() -> None:
    # Tarjan's strongly connected components over titan_rocm's own modules.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(internal(v)):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            connect(v)
    assert circles == []


def test_type_checking_imports_are_counted() -> None:
    """The registry names the workaround class it returns under ``TYPE_CHECKING``: that
    import is an edge of the graph, as every other is."""
    assert "titan_rocm.workarounds.base" in GRAPH["titan_rocm.workarounds.registry"]


def test_the_seam_table_imports_no_workaround_and_not_the_registry() -> None:
    """The seam layer stands below the workarounds: the registry hands it the seamed ones."""
    seams = "titan_rocm.workarounds.seams"
    above = sorted(m for m in internal(seams) if _in(m, (WORKAROUNDS,)))
    assert above == [], f"{seams} imports {above}"


@pytest.mark.parametrize("name", [m for m in MODULES if m.startswith(WORKAROUNDS)])
def test_workarounds_stand_on_their_own_base(name: str) -> None:
    bad = sorted(m for m in GRAPH[name]
                 for f in FORBIDDEN_IN_WORKAROUNDS if m == f or m.startswith(f + "."))
    assert bad == [], f"{name} imports {bad}"
    mine = workaround_of(name)
    others = sorted(m for m in internal(name)
                    if workaround_of(m) is not None and workaround_of(m) != mine)
    assert others == [], f"{name} reads another workaround's internals: {others}"


@pytest.mark.parametrize("name", [m for m in MODULES if m in FACTS])
def test_platform_facts_import_nothing_above_them(name: str) -> None:
    assert sorted(m for m in internal(name) if m not in FACTS) == []


@pytest.mark.parametrize("name", [m for m in MODULES if m.startswith(TOOLS)])
def test_tools_do_not_reach_into_workarounds_or_adapters(name: str) -> None:
    above = sorted(m for m in internal(name) if _in(m, (WORKAROUNDS, *ADAPTERS)))
    assert above == [], f"{name} imports {above}"


def floor_of(name: str) -> str | None:
    """Which floor module ``name`` is on (docs/architecture.md), None for an unplaced one."""
    if name == "titan_rocm" or name == "titan_rocm.assets":
        return "package"
    # The packages the layout move (issue 23) makes: their __init__ is on their files' floor.
    for floor, roots in (("test-only", (*TEST_ONLY, "titan_rocm.testing")),
                         ("scanner", (*SCANNER, "titan_rocm.scanner")),
                         ("facts", FACTS),
                         ("tuner", (*TUNING_DRIVER, "titan_rocm.tuner")),
                         ("tools", TOOLS), ("tuning", TUNING_LOOKUP),
                         ("adapters", ADAPTERS), ("cli", CLI),
                         ("workarounds", (WORKAROUNDS,)), ("tuning", ("titan_rocm.tuned_gemms",))):
        if _in(name, roots):
            return floor
    return None


def test_every_module_is_on_a_floor() -> None:
    """A new module or package (another engineer's, a merge's) is placed here on purpose,
    with the rules of its floor, or this fails naming it."""
    assert sorted(m for m in MODULES if floor_of(m) is None) == []


@pytest.mark.parametrize("name", [m for m in MODULES if m.startswith("titan_rocm.cli")])
def test_the_cli_is_above_everything_and_nothing_imports_it(name: str) -> None:
    importers = sorted(m for m in MODULES if name in internal(m) and not _in(m, CLI))
    assert importers == [], f"{importers} import the command line module {name}"


@pytest.mark.parametrize("name", [m for m in MODULES if _in(m, TUNING_LOOKUP)])
def test_what_training_reads_of_the_tuner_stands_below_the_workarounds(name: str) -> None:
    above = sorted(m for m in internal(name)
                   if floor_of(m) not in ("facts", "tuning", "tools", "scanner"))
    assert above == [], f"{name} imports {above}"


@pytest.mark.parametrize("name", [m for m in MODULES if _in(m, TUNING_DRIVER + TEST_ONLY)])
def test_the_tuner_driver_is_imported_by_no_workaround(name: str) -> None:
    importers = sorted(m for m in MODULES if name in internal(m) and floor_of(m) == "workarounds")
    assert importers == [], f"workarounds {importers} import the tuner driver {name}"


def test_tune_collect_reaches_no_adapter() -> None:
    """``tune collect`` asks the installed adapter (each generation's ``tune`` module parses
    its job and builds its trainer); the shared recorder imports no adapter, so no generation
    is reached around the ``Adapter`` interface."""
    assert sorted(m for m in internal("titan_rocm.tuner.collect") if _in(m, ADAPTERS)) == []


@pytest.mark.parametrize("name", SCANNER)
def test_the_scanner_needs_no_torch_no_triton_and_no_workaround(name: str) -> None:
    assert name in MODULES
    heavy = sorted(m for m in GRAPH[name] if _in(m, ("torch", "triton", "titan_rocm.log")))
    assert heavy == [], f"{name} imports {heavy}"
    above = sorted(m for m in internal(name) if floor_of(m) not in ("facts", "scanner"))
    assert above == [], f"{name} imports {above}"


GENERATIONS = ("titan_rocm.adapters.tt022", "titan_rocm.adapters.tt030")
"""One adapter folder per TorchTitan generation: what both need lives in adapters.common
(and adapters.meta), so a generation can be added or dropped alone."""


@pytest.mark.parametrize("generation", GENERATIONS)
def test_an_adapter_imports_no_other_generation(generation: str) -> None:
    others = tuple(g for g in GENERATIONS if g != generation)
    mine = [m for m in MODULES if _in(m, (generation,))]
    assert mine, generation
    bad = sorted(f"{m} -> {t}" for m in mine for t in internal(m) if _in(t, others))
    assert bad == []


def test_runtime_modules_never_import_test_only_code() -> None:
    bad = sorted(f"{m} -> {t}" for m in MODULES for t in TEST_ONLY
                 if t in internal(m) and m not in TEST_ONLY_IMPORTERS and m not in TEST_ONLY)
    assert bad == []


def test_settings_modes_and_the_registry_name_the_same_workarounds() -> None:
    from typing import get_type_hints

    from titan_rocm.settings import Mode, RocmSettings
    from titan_rocm.workarounds.registry import WORKAROUNDS as REGISTERED

    hints = get_type_hints(RocmSettings)
    # The audit's own on/auto/off choices (numerics_audit_submodules) gate a part of the
    # audit, not a workaround: they carry the workaround's name as their prefix.
    modes = [name for name, hint in hints.items()
             if hint == Mode and not name.startswith("numerics_audit_")]
    # numerics_audit is a schedule (off | first_step | every_n_steps), not on/auto/off: its
    # field is named after the workaround and "off" does nothing, as for every mode.
    scheduled = [name for name, hint in hints.items()
                 if name in REGISTERED and hint != Mode and "off" in typing.get_args(hint)]
    assert modes and sorted(modes + scheduled) == sorted(REGISTERED)
    assert all(name not in modes for name in scheduled)


def test_every_seam_module_a_generation_names_exists() -> None:
    from titan_rocm.workarounds.registry import WORKAROUNDS as REGISTERED
    from titan_rocm.workarounds.registry import seam_targets, seamed
    from titan_rocm.workarounds.seams import GENERATIONS

    for generation in GENERATIONS.values():
        assert set(seam_targets(generation)) == set(seamed())
        variants = [seams.items() for seams in generation.variants.values()]
        for workaround, target in [*seam_targets(generation).items(),
                                   *(i for v in variants for i in v)]:
            assert workaround in REGISTERED
            module, _, cls = target.partition(":")
            assert module in MODULES and cls in _defined_names(module), target


def _defined_names(name: str) -> set[str]:
    """Names module ``name`` binds at top level (defs, classes, assignments, imports), and,
    for a package, its submodules: what ``from name import X`` can find."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                node in tree.body:
            names.add(node.name)
    for node in tree.body:
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):  # TYPE_CHECKING, version fallbacks
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names.update((a.asname or a.name).split(".")[0] for a in sub.names)
                elif isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.add(sub.name)
                elif isinstance(sub, ast.Assign):
                    targets += sub.targets
        for target in targets:
            names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    prefix = name + "."
    names.update(m[len(prefix):].split(".")[0] for m in MODULES if m.startswith(prefix))
    return names


def test_every_name_imported_from_titan_rocm_exists() -> None:
    """A rename that misses one importer (often a lazy import inside a function, which only
    runs on a rarely used path) fails here, not in a user's hands. Importers: the package,
    the tests and the benchmarks."""
    importers = {**MODULES, **{str(f.relative_to(PACKAGE.parent)): f
                               for d in ("tests", "benchmarks")
                               for f in sorted((PACKAGE.parent / d).rglob("*.py"))}}
    missing = []
    for name, path in importers.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module in MODULES):
                continue
            defined = _defined_names(node.module)
            missing += [f"{name}: {node.module}.{a.name}" for a in node.names
                        if a.name != "*" and a.name not in defined]
    assert missing == []


GENERATION_PATHS = (*GENERATIONS, "titan_rocm.torchtitan", "titan_rocm.config",
                    "titan_rocm.train", "titan_rocm.torchtitan_version")
"""What the command line never imports: a generation's folder, the paths users type for one
generation, and the detection itself; it asks ``titan_rocm.adapters.installed()``."""


def _generation_branches(name: str) -> list[str]:
    """Comparisons in ``name`` against a generation key (``"0.3"``) or of a ``series()`` /
    ``.shape`` read: what a generation branch looks like."""
    from titan_rocm.adapters import FOLDERS

    found = []
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        for part in ast.walk(node):
            keyed = isinstance(part, ast.Constant) and part.value in FOLDERS
            read = (isinstance(part, ast.Attribute) and part.attr in ("series", "shape")) or \
                (isinstance(part, ast.Name) and part.id == "series")
            if keyed or read:
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
                break
    return found


@pytest.mark.parametrize("name", [m for m in MODULES if _in(m, CLI)])
def test_the_cli_asks_the_installed_adapter_and_holds_no_generation_branch(name: str) -> None:
    direct = sorted(m for m in GRAPH[name] if _in(m, GENERATION_PATHS))
    assert direct == [], f"{name} imports {direct}: ask titan_rocm.adapters.installed()"
    assert _generation_branches(name) == []


def _signatures(module: str, methods: bool = False) -> dict[str, str]:
    """Public functions of ``module`` (or, with ``methods``, of its ``Adapter`` class, less
    ``self``) as ``name(args) -> returns``, read from the source."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    body = tree.body
    if methods:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == "Adapter").body
    out = {}
    for node in body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            args = node.args
            if methods:
                args = ast.arguments(**{**args.__dict__, "args": args.args[1:]})
            out[node.name] = f"{node.name}({ast.unparse(args)}) -> {ast.unparse(node.returns)}"
    return out


def test_every_adapter_implements_the_interface_with_its_signatures() -> None:
    from titan_rocm.adapters import COMMANDS, FOLDERS

    interface = _signatures("titan_rocm.adapters", methods=True)
    assert {"plan", "audit", "check_job_args", "torchtitan_help",
            "tune_collect"} <= set(interface)
    for folder in FOLDERS.values():
        module = f"titan_rocm.adapters.{folder}.{COMMANDS}"
        assert module in MODULES, module
        assert _signatures(module) == interface, module


@pytest.mark.parametrize("folder", ["tt022", "tt030"])
def test_an_adapters_commands_import_no_torch(folder: str) -> None:
    """``titan-rocm plan`` refuses a bad job before torch loads: the module the CLI imports
    (and its package's ``__init__``) import torch and TorchTitan inside functions only."""
    for name in (f"titan_rocm.adapters.{folder}", f"titan_rocm.adapters.{folder}.commands"):
        tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        heavy = sorted({a.name if isinstance(n, ast.Import) else n.module or ""
                        for n in top for a in n.names}
                       - {"titan_rocm.adapters.common", "titan_rocm.torchtitan_version",
                          f"titan_rocm.adapters.{folder}.job_args"}
                       - {"__future__", "importlib", "collections.abc", "typing"})
        assert heavy == [], f"{name} imports {heavy} at the top"


LONGEST_FUNCTION = 60
"""Lines of the longest function in titan_rocm/numerics/ (issue 39): state a function's
closures would share is an object with named methods instead."""


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """Every function in ``source`` (nested ones too, each counted within its parent as well):
    its name, first line and lines, ``def`` to last line, its docstring included."""
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1)
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None]


def test_no_function_of_the_numerics_audit_is_over_60_lines() -> None:
    long = [f"{path.relative_to(PACKAGE.parent)}:{line} {name} ({lines} lines)"
            for path in sorted((PACKAGE / "numerics").rglob("*.py"))
            for name, line, lines in function_lengths(path.read_text(encoding="utf-8"))
            if lines > LONGEST_FUNCTION]
    assert not long, f"functions over {LONGEST_FUNCTION} lines: {long}"


def test_a_functions_length_counts_its_docstring_and_its_closures() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(58))
    source = (f'def outer():\n    """One\n    two."""\n    def inner():\n        pass\n{body}\n')
    assert function_lengths(source) == [("outer", 1, 63), ("inner", 4, 2)]
