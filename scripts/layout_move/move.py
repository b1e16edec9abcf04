"""The layout of titan-rocm issue 23 (items 1, 4 and 5), done with ``git mv`` and an import
rewrite, on a clean tree at a repository root. Run by move.sh; ``--dry-run`` prints the plan.

Everything is placed by a rule below. A Python file under titan_rocm/ or tests/ that no rule
places (a new file another branch added in a folder whose split is not mechanical) is listed
and nothing is moved: add a rule, run again.

Rewrites are by module path, over every .py in titan_rocm/, tests/, benchmarks/, scripts/
(new files included), and over docs/*.md, README.md and .ci/: dotted module names, and the
``titan_rocm/...py`` paths of moved files. The paths users type keep working as shims:
titan_rocm.config, titan_rocm.train, titan_rocm.torchtitan.* (each the moved module itself,
through sys.modules), titan_rocm (custom_import) and titan_rocm.cli are not moved.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path.cwd()

# -- package moves: (old path, new path); a folder moves with everything in it ------------
PACKAGE_MOVES: list[tuple[str, str]] = [
    # item 1: one adapter folder per TorchTitan generation
    ("titan_rocm/converters", "titan_rocm/adapters/tt022/converters"),
    ("titan_rocm/config.py", "titan_rocm/adapters/tt022/config.py"),
    ("titan_rocm/_registration.py", "titan_rocm/adapters/tt022/registration.py"),
    ("titan_rocm/plan.py", "titan_rocm/adapters/tt022/plan.py"),
    ("titan_rocm/preflight.py", "titan_rocm/adapters/tt022/preflight.py"),
    ("titan_rocm/job_args.py", "titan_rocm/adapters/tt022/job_args.py"),
    ("titan_rocm/train.py", "titan_rocm/adapters/tt022/train.py"),
    ("titan_rocm/torchtitan", "titan_rocm/adapters/tt030"),
    # item 4: the scanner below the workarounds
    ("titan_rocm/workarounds/triton_war/amdgcn.py", "titan_rocm/scanner/amdgcn.py"),
    ("titan_rocm/workarounds/triton_war/hazards.py", "titan_rocm/scanner/hazards.py"),
    ("titan_rocm/workarounds/triton_war/scan.py", "titan_rocm/scanner/scan.py"),
    ("titan_rocm/workarounds/triton_war/names.py", "titan_rocm/scanner/names.py"),
    # item 4: the tuner's driver (a tool) apart from what training reads (tuning/)
    ("titan_rocm/tuning/collect.py", "titan_rocm/tuner/collect.py"),
    ("titan_rocm/tuning/runner.py", "titan_rocm/tuner/runner.py"),
    ("titan_rocm/tuning/minesweeper.py", "titan_rocm/tuner/minesweeper.py"),
    ("titan_rocm/tuning/settings.py", "titan_rocm/tuner/settings.py"),
    # item 4: test-only code in a package of its own
    ("titan_rocm/tuning/faults.py", "titan_rocm/testing/faults.py"),
    ("titan_rocm/workarounds/moe_eager_compile/graph_audit.py", "titan_rocm/testing/graph_audit.py"),  # noqa: E501
]
KEEP_IN_PLACE = {
    # TorchTitan 0.3.0 registers an @override under its function's module path: users list
    # "titan_rocm.torchtitan.override.rocm" in --override.imports, so the module stays there.
    "titan_rocm/torchtitan/override.py",
}
"""Files of a moved folder that stay where they are (they are what users name)."""
KEPT_MODULES = {".".join(Path(f).with_suffix("").parts) for f in KEEP_IN_PLACE}

NEW_PACKAGES = {
    "titan_rocm/adapters": "The TorchTitan adapters, one folder per generation (tt022: converters over the\nTOML JobConfig; tt030: config functions and Trainer.Config).",  # noqa: E501
    "titan_rocm/adapters/tt022": "TorchTitan 0.2.2's adapter: converters, the [rocm] JobConfig extension, the\nlauncher, the plan and the start-up checks.",  # noqa: E501
    "titan_rocm/scanner": "The AMDGCN parser, hazard rules and cache scanner behind ``titan-rocm scan`` and\n``rocm.triton_war`` (no torch, no Triton).",  # noqa: E501
    "titan_rocm/tuner": "``titan-rocm tune``'s driver: collect, run (the minesweeper and its workers); a tool\nthat may act as an adapter. What training reads of the tuning is ``titan_rocm.tuning``.",  # noqa: E501
    "titan_rocm/testing": "Code that exists for tests and worker processes (fault injection, graph audit):\nthe runtime never imports it.",  # noqa: E501
}
"""New packages and their ``__init__`` docstring (a moved folder brings its own)."""

STAYS_UNDER_MOVED = {
    # files that stay where they are in a folder some of whose files move
    "titan_rocm/tuning": {"__init__.py", "problems.py", "records.py", "table.py", "env.py",
                          "choices.py"},
    "titan_rocm/workarounds/triton_war": {"__init__.py", "bootstrap.py", "buffer_ops.py",
                                          "cache_tag.py", "compile_hook.py", "compile_lock.py",
                                          "stats.py", "workaround.py"},
}
"""A folder split file by file: every file of it is named (a new one is listed, not guessed)."""

USER_FACING = {
    # old module -> it keeps a shim there (users type these paths)
    "titan_rocm.config", "titan_rocm.train",
    # not typed by users, but named inside child-interpreter code (python -c) in the tests
    "titan_rocm._registration",
}
USER_FACING_PACKAGES = {"titan_rocm.torchtitan"}
"""Every module of these packages keeps a shim at its old path."""
RUN_AS_MAIN = {"titan_rocm.train"}
"""Shims that ``python -m`` runs: they call ``main()``."""

# -- tests: (old path under tests/, new path); helpers go to tests/support/ ----------------
TEST_MOVES: dict[str, str] = {
    "test_architecture.py": "unit/test_architecture.py",
    "test_platform_aiter.py": "unit/test_platform_aiter.py",
    "test_torchtitan_version.py": "unit/test_torchtitan_version.py",
    "test_amdgcn_parser.py": "unit/scanner/test_amdgcn.py",
    "test_hazard_rules.py": "unit/scanner/test_hazards.py",
    "test_bench_summary.py": "unit/logs/test_summary.py",
    "test_compare.py": "unit/logs/test_compare.py",
    "test_compare_plot.py": "unit/logs/test_plot.py",
    "test_log_parse.py": "unit/logs/test_parse.py",
    "test_log_verdict.py": "unit/logs/test_verdict.py",
    "test_cli.py": "unit/cli/test_cli.py",
    "test_check_log_cli.py": "unit/cli/test_check_log.py",
    "test_scan_cli.py": "unit/cli/test_scan.py",
    "test_gemm_tables.py": "unit/gemm_tables/test_gemm_tables.py",
    "test_tuning.py": "unit/tuning/test_tuning.py",
    "test_stub_generation.py": "unit/workarounds/test_stub_generation.py",
    "test_compiled_numerics.py": "unit/workarounds/test_compiled_numerics.py",
    "test_divergence_guard.py": "unit/workarounds/divergence_guard/test_divergence_guard.py",
    "test_experts_compile.py": "unit/workarounds/grouped_mm/test_experts_compile.py",
    "test_grouped_mm.py": "unit/workarounds/grouped_mm/test_grouped_mm.py",
    "test_mla_attention.py": "unit/workarounds/mla_attention/test_mla_attention.py",
    "test_mla_fake_aiter.py": "unit/workarounds/mla_attention/test_fake_aiter.py",
    "test_mla_routing.py": "unit/workarounds/mla_attention/test_routing.py",
    "test_mla_varlen.py": "unit/workarounds/mla_attention/test_varlen.py",
    "test_mla_varlen_packing.py": "unit/workarounds/mla_attention/test_varlen_packing.py",
    "test_moe_eager_compile.py": "unit/workarounds/moe_eager_compile/test_moe_eager_compile.py",
    "test_triton_compile_hook.py": "unit/workarounds/triton_war/test_compile_hook.py",
    "test_triton_war_bootstrap.py": "unit/workarounds/triton_war/test_bootstrap.py",
    "test_triton_war_workaround.py": "unit/workarounds/triton_war/test_workaround.py",
    "test_check_result_logs.py": "unit/benchmarks/test_check_result_logs.py",
    "test_compare_figures.py": "unit/benchmarks/test_compare_figures.py",
    "test_gpu_validation_harness.py": "unit/benchmarks/test_gpu_validation_harness.py",
    "test_validated_tuning_harness.py": "unit/benchmarks/test_validated_tuning_harness.py",
    # the TorchTitan 0.2.2 adapter's suite (its real trainer, its parser, its plan)
    "test_config.py": "tt022/test_config.py",
    "test_configs.py": "tt022/test_configs.py",
    "test_converters.py": "tt022/test_converters.py",
    "test_moe_scope_inspection.py": "tt022/test_moe_scope_inspection.py",
    "test_plan.py": "tt022/test_plan.py",
    "test_plan_fuzz.py": "tt022/test_plan_fuzz.py",
    "test_preflight.py": "tt022/test_preflight.py",
    "test_train_launcher.py": "tt022/test_train_launcher.py",
}
TEST_HELPERS = ["benchmark_loader", "compare_logs", "cpu_single_process", "cpu_support",
                "cpu_trainer", "gemm_table_maker", "mla_test_support", "moe_scope_worker",
                "moe_test_models", "startup_oracle", "stub_generation",
                "triton_war_hook_kernels", "tune_problems", "tune_trainer"]
"""Helper modules flat in tests/ -> tests/support/ (imported as ``tests.support.<name>``)."""
TEST_PREFIX_RULES: list[tuple[str, str]] = [
    # a new test file of a package whose tests have a folder already
    ("test_numerics_", "unit/numerics/"),
    ("test_tt022_", "tt022/"),
    ("test_gpu_", "gpu/"),
]
TESTS_STAY = {"conftest.py", "tt030", "gpu", "fixtures", "corpus", "fake_aiter", "__init__.py",
              "__pycache__"}
"""What stays in tests/ (the 0.3.0 suite and tests/gpu/ are in place already; data folders)."""


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout


def tracked() -> list[str]:
    return git("ls-files").splitlines()


def module_of(path: str) -> str:
    parts = list(Path(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def plan_moves(files: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Every file move (old, new), and what no rule places."""
    moves: list[tuple[str, str]] = []
    unplaced: list[str] = []
    for old, new in PACKAGE_MOVES:
        if (ROOT / old).is_dir():
            moves += [(f, new + f[len(old):]) for f in files
                      if f.startswith(old + "/") and f not in KEEP_IN_PLACE]
        elif (ROOT / old).is_file():
            moves.append((old, new))
        else:
            unplaced.append(f"{old} (a move's source is missing)")
    moved = {old for old, _ in moves}
    for folder, stays in STAYS_UNDER_MOVED.items():
        for f in files:
            if f.startswith(folder + "/") and f.count("/") == folder.count("/") + 1 \
                    and f.endswith(".py") and f not in moved and Path(f).name not in stays:
                unplaced.append(f"{f} (in {folder}/, which is split file by file: say whether "
                                "it moves, in PACKAGE_MOVES or STAYS_UNDER_MOVED)")
    for f in files:
        if not f.startswith("tests/") or f.count("/") != 1:
            continue
        name = f[len("tests/"):]
        if name in TESTS_STAY:
            continue
        if name in TEST_MOVES:
            moves.append((f, "tests/" + TEST_MOVES[name]))
        elif name.endswith(".py") and name[:-3] in TEST_HELPERS:
            moves.append((f, f"tests/support/{name}"))
        elif any(name.startswith(p) for p, _ in TEST_PREFIX_RULES):
            dest = next(d for p, d in TEST_PREFIX_RULES if name.startswith(p))
            moves.append((f, f"tests/{dest}{name}"))
        else:
            unplaced.append(f"{f} (a test file or helper no rule places: TEST_MOVES, "
                            "TEST_HELPERS or TEST_PREFIX_RULES)")
    return moves, unplaced


def module_map(moves: list[tuple[str, str]]) -> dict[str, str]:
    """Old dotted module -> new, for every moved Python module (helpers by bare name)."""
    result = {}
    for old, new in moves:
        if not old.endswith(".py"):
            continue
        if old.startswith("tests/"):
            if Path(old).stem in TEST_HELPERS:
                result[Path(old).stem] = module_of(new)
            continue
        result[module_of(old)] = module_of(new)
    for old, new in PACKAGE_MOVES:  # a moved folder is a moved package
        if not old.endswith(".py"):
            result[module_of(old)] = module_of(new)
    return result


def user_facing(module: str) -> bool:
    return module in USER_FACING or any(module == p or module.startswith(p + ".")
                                        for p in USER_FACING_PACKAGES)


# -- rewriting -----------------------------------------------------------------------------

def _dotted_pattern(names: list[str]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?<![\w.])({alternatives})(?![\w])")


def rewrite_text(text: str, mapping: dict[str, str], strings_too: bool) -> str:
    """Dotted package names (not bare helper names, not user-facing paths) everywhere."""
    names = [m for m in mapping if "." in m and (strings_too and not user_facing(m))]
    if not names:
        return text
    pattern = _dotted_pattern(names)
    return pattern.sub(lambda m: mapping[m.group(1)], text)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def rewrite_imports(text: str, mapping: dict[str, str], module: str, is_package: bool) -> str:
    """Import statements of moved modules (user-facing and bare helper names included)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            new_aliases, changed = [], False
            for a in node.names:
                target = _moved(a.name, mapping)
                if target is None:
                    new_aliases.append(a.name + (f" as {a.asname}" if a.asname else ""))
                    continue
                changed = True
                if a.asname:
                    new_aliases.append(f"{target} as {a.asname}")
                elif "." in a.name:  # import a.b.c binds a: keep it reachable by its name
                    new_aliases.append(target)
                else:  # import bare_helper
                    parent, _, leaf = target.rpartition(".")
                    edits.append(_stmt(lines, node, f"from {parent} import {leaf}"
                                       if len(node.names) == 1 else None))
                    changed = False
                    break
            if changed:
                edits.append(_stmt(lines, node, "import " + ", ".join(new_aliases)))
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(node, module, is_package)
            whole = _moved(source, mapping)
            parts: dict[str, list[str]] = {}
            for a in node.names:
                sub = _moved(f"{source}.{a.name}", mapping) if a.name != "*" else None
                if sub is not None and whole is None:
                    parent, _, leaf = sub.rpartition(".")
                    alias = a.asname or (a.name if leaf != a.name else None)
                    parts.setdefault(parent, []).append(leaf + (f" as {alias}" if alias else ""))
                else:
                    parts.setdefault(whole or source, []).append(
                        a.name + (f" as {a.asname}" if a.asname else ""))
            if whole is None and list(parts) == [source]:
                continue  # nothing it names moved
            renamed = _renamed_in_place(lines, node, parts)
            if renamed is not None:
                edits.append(renamed)
                continue
            body = "\n".join(f"from {m} import {', '.join(names)}" for m, names in parts.items())
            edits.append(_stmt(lines, node, body))
    for start, end, new in sorted((e for e in edits if e[2] is not None), reverse=True):
        lines[start:end] = [new]
    return "".join(lines)


def _renamed_in_place(lines: list[str], node: ast.ImportFrom,
                      parts: dict[str, list[str]]) -> tuple[int, int, str] | None:
    """The statement with only its module replaced (comments and layout kept), when one module
    now holds every name under the name it had; else None (the statement is re-rendered)."""
    if len(parts) != 1:
        return None
    ((target, names),) = parts.items()
    if names != [a.name + (f" as {a.asname}" if a.asname else "") for a in node.names]:
        return None
    start, end = node.lineno - 1, node.end_lineno or node.lineno
    text = "".join(lines[start:end])
    new, count = re.subn(r"\bfrom\s+[.\w]+\s+import\b", f"from {target} import", text, count=1)
    return (start, end, new) if count else None


def _moved(name: str, mapping: dict[str, str]) -> str | None:
    if any(name == k or name.startswith(k + ".") for k in KEPT_MODULES):
        return None
    for old in sorted(mapping, key=len, reverse=True):
        if name == old or name.startswith(old + "."):
            return mapping[old] + name[len(old):]
    return None


def _stmt(lines: list[str], node: ast.stmt, body: str | None) -> tuple[int, int, str | None]:
    start, end = node.lineno - 1, node.end_lineno or node.lineno
    if body is None:
        return start, end, None
    first = lines[start]
    indent = first[: len(first) - len(first.lstrip())]
    last = lines[end - 1].rstrip("\n")
    comment = ""
    if "#" in last and node.end_col_offset is not None and last[node.end_col_offset:].strip():
        comment = "  " + last[node.end_col_offset:].strip()
    rendered = "\n".join(indent + line for line in body.splitlines())
    return start, end, rendered + comment + "\n"


PATH_CHAIN = re.compile(
    r"Path\(__file__\)(?P<resolve>\.resolve\(\))?"
    r"(?P<chain>\.parents\[(?P<n>\d+)\]|(?:\.parent(?![s\w]))+)")


def rewrite_file_anchors(text: str, old: str, new: str) -> str:
    """``Path(__file__)...parent`` chains of a moved test file: the same folder from there."""
    old_parents, new_parents = Path(old).parents, list(Path(new).parents)

    def fix(m: re.Match[str]) -> str:
        level = int(m.group("n")) if m.group("n") else m.group("chain").count(".parent") - 1
        target = old_parents[level]
        if target not in new_parents:
            raise SystemExit(f"move.py: {new}: {m.group(0)} names {target}, which is not above "
                             "its new place; fix by hand")
        resolve = ".resolve()" if m.group("resolve") or new_parents.index(target) else ""
        return f"Path(__file__){resolve}.parents[{new_parents.index(target)}]"

    text = PATH_CHAIN.sub(fix, text)
    if "os.path.dirname(os.path.abspath(__file__))" in text:
        depth = len(Path(new).parents) - len(Path(old).parents)
        text = text.replace("os.path.dirname(os.path.abspath(__file__))",
                            "os.path.dirname(" * (depth + 1) + "os.path.abspath(__file__)"
                            + ")" * (depth + 1))
    return text


def rewrite_paths(text: str, moves: list[tuple[str, str]]) -> str:
    """Mentions of a moved file by its repository path (docs, subprocess command lines)."""
    for old, new in sorted(moves, key=lambda m: len(m[0]), reverse=True):
        text = re.sub(rf"(?<![\w/]){re.escape(old)}(?![\w])", new, text)
        if old.startswith("tests/") and old.count("/") == 1:
            # REPO / "tests" / "name.py" -> REPO / "tests" / "support" / "name.py"
            name = old.split("/")[1]
            parts = new.split("/")[1:-1]
            text = text.replace(f'"tests" / "{name}"',
                                " / ".join(f'"{p}"' for p in ["tests", *parts, name]))
    return text


LIMIT = 100


def wrap_long_lines(path: Path, before: set[str]) -> list[str]:
    """Re-wrap docstring and comment lines the rewrite pushed past the line limit; mark code
    lines ``noqa: E501`` and return them (``file:line``) for a person to rewrap."""
    import io
    import tokenize

    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    if not any(len(line.rstrip("\n")) > LIMIT for line in lines):
        return []
    kinds: dict[int, str] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    previous = None
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            kinds.setdefault(tok.start[0], "comment")
        elif tok.type == tokenize.STRING and tok.string.startswith(("\"" * 3, "'" * 3)) and (
                previous is None or previous.type in (tokenize.NEWLINE, tokenize.INDENT,
                                                      tokenize.DEDENT, tokenize.NL)):
            for row in range(tok.start[0], tok.end[0] + 1):
                kinds[row] = "docstring"
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            previous = tok
    out, flagged = [], []
    for number, line in enumerate(lines, 1):
        body = line.rstrip("\n")
        if len(body) <= LIMIT or "noqa" in body or body in before or \
                body.lstrip().startswith(("from ", "import ")):  # ruff's isort wraps imports
            out.append(line)
            continue
        kind = kinds.get(number)
        cut = body.rfind(" ", 0, LIMIT)
        indent = body[: len(body) - len(body.lstrip())]
        if kind == "docstring" and cut > len(indent):
            out += [body[:cut] + "\n", indent + body[cut + 1:] + "\n"]
        elif kind == "comment" and body.lstrip().startswith("#") and cut > len(indent):
            out += [body[:cut] + "\n", indent + "# " + body[cut + 1:] + "\n"]
        else:
            out.append(body + "  # noqa: E501\n")
            flagged.append(f"{path.relative_to(ROOT)}:{number}")
    path.write_text("".join(out), encoding="utf-8")
    return flagged


SCRIPT_BOOT = (
    "if __package__ in (None, \"\"):  # run as a script: tests.support imports need the repo root\n"
    "    import sys as _sys\n"
    "    from pathlib import Path as _Path\n\n"
    "    _sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))\n"
)


def package_shim(old_module: str, new_module: str) -> str:
    """A user-facing package stays a package (its submodules are shims found on its own
    path), with every name of the moved package."""
    return (
        f'"""``{old_module}``, the path users type.\n\nThe package moved to ``{new_module}``; '
        "its names are here, and each of its\nmodules is a shim beside this file.\n"
        '"""\n\nimport importlib\n\n'
        f'_module = importlib.import_module("{new_module}")\n'
        "globals().update({k: v for k, v in vars(_module).items() if not k.startswith(\"__\")})\n"
        "__doc__ = _module.__doc__\n"
        'if hasattr(_module, "__all__"):\n    __all__ = list(_module.__all__)\n'
    )


def shim(old_module: str, new_module: str) -> str:
    main = old_module in RUN_AS_MAIN
    text = (
        f'"""``{old_module}``, the path users type.\n\nThe module moved to ``{new_module}``; '
        "this name is that module\nitself (one module object, whichever path imports it).\n"
        '"""\n\nimport importlib\nimport sys\n\n'
        f'_module = importlib.import_module("{new_module}")\n'
    )
    if main:
        text += 'if __name__ == "__main__":\n    sys.exit(_module.main())\n'
        text += "sys.modules[__name__] = _module\n"
    else:
        text += "sys.modules[__name__] = _module\n"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="move.py")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    files = tracked()
    moves, unplaced = plan_moves(files)
    if unplaced:
        print("move.py: not placed (nothing moved):", *unplaced, sep="\n  ", file=sys.stderr)
        return 1
    mapping = module_map(moves)
    if args.dry_run:
        for old, new in moves:
            print(f"{old} -> {new}")
        print(*(f"shim {m} -> {n}" for m, n in mapping.items() if user_facing(m)), sep="\n")
        return 0
    for folder in sorted({str(Path(n).parent) for _, n in moves}):
        (ROOT / folder).mkdir(parents=True, exist_ok=True)
    for old, new in moves:
        git("mv", old, new)
    for folder, doc in NEW_PACKAGES.items():
        init = ROOT / folder / "__init__.py"
        if not init.exists():
            init.write_text(f'"""{doc}"""\n')
    for init in ("tests/__init__.py", "tests/support/__init__.py"):
        if not (ROOT / init).exists():
            (ROOT / init).write_text('"""titan-rocm\'s tests (a package: helpers import as '
                                     'tests.support.<name>)."""\n')
    # shims at the user-facing paths
    for old_module, new_module in mapping.items():
        if user_facing(old_module):
            path = ROOT / (old_module.replace(".", "/") + ".py")
            package_dir = ROOT / old_module.replace(".", "/")
            if old_module in USER_FACING_PACKAGES:
                package_dir.mkdir(parents=True, exist_ok=True)
                (package_dir / "__init__.py").write_text(package_shim(old_module, new_module))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(shim(old_module, new_module))
    # rewrite every Python file (new ones too) and the docs
    new_of = dict(moves)
    py_files = [p for d in ("titan_rocm", "tests", "benchmarks", "scripts")
                for p in sorted((ROOT / d).rglob("*.py")) if "fake_aiter" not in p.parts]
    shims = {ROOT / (m.replace(".", "/") + ".py") for m in mapping if user_facing(m)} | {
        ROOT / m.replace(".", "/") / "__init__.py" for m in USER_FACING_PACKAGES}
    helpers_run_as_scripts = []
    originals: dict[Path, set[str]] = {}
    for path in py_files:
        if path in shims:
            continue
        rel = str(path.relative_to(ROOT))
        text = original = path.read_text(encoding="utf-8")
        originals[path] = set(original.splitlines())
        module = module_of(rel)
        text = rewrite_text(text, mapping, strings_too=True)
        text = rewrite_imports(text, mapping, module, path.name == "__init__.py")
        text = rewrite_paths(text, moves)
        old = next((o for o, n in new_of.items() if n == rel), None)
        if old is not None and old.startswith("tests/"):
            text = rewrite_file_anchors(text, old, rel)
        for helper in TEST_HELPERS:  # "helper:Class" targets loaded by name
            text = re.sub(rf'(["\']){helper}:', rf"\1tests.support.{helper}:", text)
            # code run by a child interpreter (python -c "import helper"), at a line start
            text = re.sub(rf"^(\s*)import {helper}\b", rf"\1from tests.support import {helper}",
                          text, flags=re.M)
            text = re.sub(rf"^(\s*)from {helper} import\b",
                          rf"\1from tests.support.{helper} import", text, flags=re.M)
        if rel.startswith("tests/support/") and 'if __name__ == "__main__"' in text \
                and "from tests.support" in text:
            helpers_run_as_scripts.append(path)
        if text != original:
            path.write_text(text, encoding="utf-8")
    long_code = []
    for path in py_files:
        if path.exists() and path not in shims and path in originals:
            long_code += wrap_long_lines(path, originals[path])
    for path in helpers_run_as_scripts:
        text = path.read_text(encoding="utf-8")
        marker = "from __future__ import annotations\n"
        if marker in text and SCRIPT_BOOT not in text:
            text = text.replace(marker, marker + "\n" + SCRIPT_BOOT, 1)
            path.write_text(text, encoding="utf-8")
    ci = sorted((ROOT / ".ci").rglob("*")) if (ROOT / ".ci").is_dir() else []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *ci]:
        if not path.is_file():
            continue
        text = original = path.read_text(encoding="utf-8")
        text = rewrite_text(text, mapping, strings_too=True)
        text = rewrite_paths(text, moves)
        if text != original:
            path.write_text(text, encoding="utf-8")
    print(f"move.py: {len(moves)} files moved; {len(mapping)} module paths rewritten")
    if long_code:
        print("move.py: code lines over 100 characters after the rewrite (marked noqa: E501; "
              "rewrap them):", *long_code, sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
