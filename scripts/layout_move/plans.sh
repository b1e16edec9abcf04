#!/usr/bin/env bash
# titan-rocm plan on every shipped config into OUT_DIR (one file each, with its exit code),
# to diff before and after the move: plans.sh OUT_DIR (run at the repo root, venv active).
set -uo pipefail
out="$1"; mkdir -p "$out"
for cfg in configs/*.toml; do
  name="$(basename "$cfg" .toml)"
  for arch in gfx942 gfx950; do
    titan-rocm plan --job.config_file "$cfg" --arch "$arch" --json > "$out/$name.$arch.json" 2> "$out/$name.$arch.err"
    echo "exit $?" >> "$out/$name.$arch.err"
  done
done
