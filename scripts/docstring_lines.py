"""Count docstring lines in titan_rocm/ (issue 39, item 6: docstrings say why, briefly).

A docstring line is a non-blank line inside a string statement of a body: a module, class or
function docstring, or an attribute docstring (any expression statement whose value is a str
constant). Prints the totals, then the files with the most docstring lines.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def count(path: Path) -> tuple[int, int]:
    """(non-blank lines, non-blank docstring lines) of one Python file."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    in_string: set[int] = set()
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            assert node.end_lineno is not None
            in_string.update(range(node.lineno, node.end_lineno + 1))
    blank = {n for n, line in enumerate(lines, 1) if not line.strip()}
    return len(lines) - len(blank), len(in_string - blank)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Count docstring lines in a package.")
    parser.add_argument("package", nargs="?", default=str(ROOT / "titan_rocm"))
    parser.add_argument("--top", type=int, default=20, help="files to list (0: none, -1: all)")
    parser.add_argument("--files", nargs="*", help="also total these files or folders alone")
    args = parser.parse_args(argv)
    package = Path(args.package)
    if not package.is_dir():
        print(f"docstring_lines: {package} is not a folder; give the package folder.",
              file=sys.stderr)
        return 2
    per_file = {p: count(p) for p in sorted(package.rglob("*.py"))}
    total = sum(n for n, _ in per_file.values())
    docs = sum(d for _, d in per_file.values())
    ranked = sorted(per_file.items(), key=lambda item: -item[1][1])
    shown = ranked if args.top < 0 else ranked[: args.top]
    for path, (n, d) in shown:
        print(f"{d:6d} {n:6d}  {path.relative_to(package.parent)}")
    if args.files:
        picked = [Path(f).resolve() for f in args.files]
        chosen = [
            v for p, v in per_file.items()
            if any(p.resolve() == q or q in p.resolve().parents for q in picked)
        ]
        print(
            f"selected: {sum(d for _, d in chosen)} docstring lines of "
            f"{sum(n for n, _ in chosen)} non-blank lines in {len(chosen)} files"
        )
    print(f"total: {docs} docstring lines of {total} non-blank lines in {len(per_file)} files "
          f"({100 * docs / max(total, 1):.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
