#!/usr/bin/env bash
# Run the tests twice, each time in a fresh random order, to catch a test that passes only
# after (or before) another: tests/conftest.py's --random-order SEED shuffles the modules and
# the tests inside each module.
#
#   scripts/random_order.sh [PYTEST_ARGS...]
#
# Without PYTEST_ARGS it is the plain run of the installed TorchTitan's suite (pyproject's
# -m 'not slow'); `-m torchtitan022` / `-m torchtitan030` run a whole suite, slow tests
# included; `tests/unit -x` one folder. The interpreter is $PYTHON, else `python` (README's
# activated venv). Each run prints its seed first; a failing order comes back with
# `python -m pytest --random-order SEED PYTEST_ARGS`. $RANDOM_ORDER_SEEDS (two integers)
# repeats two given orders instead of drawing new ones. One line per run at the end:
#   random order: seed 2718281828: 1402 passed, 62 deselected (pytest exit 0)
# Exit 0 when both runs passed, else the exit code of the first run that did not.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-python}"
command -v "$python" >/dev/null \
  || { echo "random_order: no interpreter $python; activate the venv or set PYTHON" >&2; exit 2; }
if [[ -n "${RANDOM_ORDER_SEEDS:-}" ]]; then
  read -r -a seeds <<<"$RANDOM_ORDER_SEEDS"
  [[ ${#seeds[@]} -eq 2 && "${seeds[0]}${seeds[1]}" =~ ^[0-9]+$ ]] \
    || { echo "random_order: RANDOM_ORDER_SEEDS='$RANDOM_ORDER_SEEDS' is not valid; accepted: two integers, e.g. '1 2'" >&2; exit 2; }
else
  seeds=("$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')" "$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')")
fi

lines=() status=0
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for seed in "${seeds[@]}"; do
  echo "random order: seed $seed: $python -m pytest -q --random-order $seed $*"
  "$python" -m pytest -q --random-order "$seed" "$@" 2>&1 | tee "$log"
  rc="${PIPESTATUS[0]}"
  counts="$(grep -E '(passed|failed|error|skipped|deselected|no tests ran)' "$log" | tail -n 1 \
    | sed -E 's/^=+ //; s/ =+$//; s/ in [0-9.]+s( \([0-9:]+\))?$//')"
  lines+=("random order: seed $seed: ${counts:-no pytest summary} (pytest exit $rc)")
  ((rc == 0 || status != 0)) || status="$rc"
done
printf '%s\n' "${lines[@]}"
exit "$status"
