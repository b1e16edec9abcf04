#!/usr/bin/env bash
# titan-rocm plan on every shipped config into OUT_DIR (one file each, with its exit code),
# to diff before and after a refactor that must not change a plan (issue 23's layout move was
# checked so): scripts/plans.sh OUT_DIR, at the repo root with the 0.2.2 venv active; then
# diff -r BEFORE AFTER must be empty.
set -uo pipefail
out="$1"; mkdir -p "$out"
for cfg in configs/*.toml; do
  name="$(basename "$cfg" .toml)"
  for arch in gfx942 gfx950; do
    titan-rocm plan --job.config_file "$cfg" --arch "$arch" --json > "$out/$name.$arch.json" 2> "$out/$name.$arch.err"
    echo "exit $?" >> "$out/$name.$arch.err"
  done
done
