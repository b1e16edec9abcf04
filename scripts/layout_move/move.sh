#!/usr/bin/env bash
# The layout of titan-rocm issue 23 (items 1, 4, 5): run at the repository root of a clean
# tree (after every branch is merged). Moves with git mv, rewrites imports by module path,
# leaves shims at the paths users type, copies the redrawn docs/architecture.md in.
# Fails (moving nothing) on a file it cannot place, listing it. Does not commit.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
test -f pyproject.toml && test -d titan_rocm || { echo "move.sh: run at the titan-rocm root" >&2; exit 2; }
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "move.sh: the tree has uncommitted changes; commit or stash them first" >&2; exit 2
fi
python3 "$here/move.py" "$@"
case " $* " in *" --dry-run "*) exit 0;; esac
cp "$here/docs-architecture.md" docs/architecture.md
python3 "$here/readme_layout.py" README.md
# pytest: the repo root on sys.path, so tests.support imports in every test and its workers
python3 - <<'PY'
from pathlib import Path
p = Path("pyproject.toml"); s = p.read_text()
if "pythonpath" not in s:
    s = s.replace('testpaths = ["tests"]\n', 'testpaths = ["tests"]\npythonpath = ["."]\n', 1)
    p.write_text(s)
PY
# import order after the rewrite (ruff's isort rules only), then everything must be clean
if command -v ruff >/dev/null; then ruff check --select I,F401 --fix -q . || true; ruff check .; fi
git add -A
echo "move.sh: done; review git status, run ruff, both suites and titan-rocm plan on the configs"
