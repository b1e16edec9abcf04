#!/usr/bin/env bash
# Every test, as README's test command and .ci/run run them: TorchTitan 0.2.2's suite in
# .venv and 0.3.0's in .venv030, at the same time, the 0.2.2 suite in two processes (its
# audit tests, tests/unit/numerics, and the rest), so two cores stay busy to the end.
#
#   scripts/test_suites.sh [PYTEST_ARGS...]        e.g. --random-order any, or -x
#
# Each process runs on one thread (OMP_NUM_THREADS=1): processes with torch's default of one
# thread per core spin against each other in OpenMP's barriers (0.3.0's bf16 FSDP audit test
# took 103 s beside the other suite, 25 s alone). Each process writes .test-logs/NAME.log;
# its summary line is printed when it ends, and the last lines of a log whose run failed.
# Exit 0 when every process passed, else 1.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
for venv in .venv .venv030; do
  [[ -x "$venv/bin/python" ]] \
    || { echo "test_suites: no $venv/bin/python; README's test command makes both venvs" >&2; exit 2; }
done
mkdir -p .test-logs
export OMP_NUM_THREADS=1

declare -A commands=(
  [tt022-numerics]=".venv/bin/python -m pytest -q -m torchtitan022 tests/unit/numerics"
  [tt022-rest]=".venv/bin/python -m pytest -q -m torchtitan022 --ignore=tests/unit/numerics"
  [tt030]=".venv030/bin/python -m pytest -q -m torchtitan030"
)
declare -A pids=()
# A background job of a script ignores SIGINT: Ctrl-C ends the runs through this trap.
trap 'kill "${pids[@]}" 2>/dev/null; echo "test_suites: interrupted" >&2; exit 130' INT TERM
start=$SECONDS
for name in tt030 tt022-numerics tt022-rest; do
  echo "test_suites: $name: ${commands[$name]} $* > .test-logs/$name.log"
  # shellcheck disable=SC2086 - the command's words are split on purpose
  ${commands[$name]} "$@" > ".test-logs/$name.log" 2>&1 &
  pids[$name]=$!
done

status=0
while ((${#pids[@]})); do
  wait -n -p ended "${pids[@]}"  # the next process to end, whichever it is
  rc=$?
  for name in "${!pids[@]}"; do [[ "${pids[$name]}" == "$ended" ]] && break; done
  unset "pids[$name]"
  summary="$(grep -E '(passed|failed|error|no tests ran)' ".test-logs/$name.log" | tail -n 1)"
  echo "test_suites: $name: ${summary:-no pytest summary} (pytest exit $rc, after $((SECONDS - start)) s)"
  if ((rc != 0)); then
    status=1
    tail -n 60 ".test-logs/$name.log"
  fi
done
exit "$status"
