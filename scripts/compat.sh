#!/usr/bin/env bash
# Run titan-rocm's CPU suites against one torch release, each TorchTitan in a scratch venv:
#
#   scripts/compat.sh TORCH_VERSION [TORCHTITAN] [options] [-- PYTEST_ARGS...]
#
# TORCHTITAN is 0.2.2, 0.3.0 or both (the default, as README's test command). Each venv gets
# torch==TORCH_VERSION first (pinned; a CUDA build runs these suites on CPU), the Triton that
# torch's metadata requires (a CPU build names none: --triton, default README's 3.9.0), then
# torchtitan==TORCHTITAN and this checkout with its test extra. The 0.2.2 suite is README's
# `python -m pytest -q -m torchtitan022`, the 0.3.0 suite `python -m pytest -q -m
# torchtitan030` (each marker runs its whole suite, slow tests included); PYTEST_ARGS
# (e.g. tests/unit) are added to both. One line per suite at the end, e.g.
#   compat: torch 2.15.0 + TorchTitan 0.3.0: 137 passed (log: /tmp/.../pytest.log)
# Exit 0 when every suite passed, 1 when one failed, 2 on bad input or a failed install.
#
# Options:
#   --reuse          keep a venv this script built before for the same torch and TorchTitan
#                    (no pip at all: a re-run costs only the tests); absent, it is built
#   --torch-from V   take torch and its wheels (CUDA, Triton) from the venv V instead of
#                    installing them: V's site-packages are read after the scratch venv's own,
#                    V is never written
#   --dir D          where the venvs go (default: $COMPAT_DIR, else ${TMPDIR:-/tmp}/titan-rocm-compat)
#   --python P       interpreter the venvs are made from (default: python3.11, else python3)
#   --triton VER     Triton for a torch that requires none (default 3.9.0)
#
# A pip constraints file that caps torch below TORCH_VERSION stops the install, with pip's own
# reason (its log's last lines); PIP_CONSTRAINT=/dev/null in front lifts it for this run.
set -uo pipefail

fail() { echo "compat: $*" >&2; exit 2; }

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
torch_version="" titans="" reuse=0 torch_from="" triton="3.9.0"
dir="${COMPAT_DIR:-${TMPDIR:-/tmp}/titan-rocm-compat}"
python="$(command -v python3.11 || command -v python3 || true)"
pytest_args=()
while (($#)); do
  case "$1" in
    --reuse) reuse=1 ;;
    --torch-from|--dir|--python|--triton)
      (($# >= 2)) || fail "$1 needs a value"
      case "$1" in
        --torch-from) torch_from="$2" ;; --dir) dir="$2" ;;
        --python) python="$2" ;; --triton) triton="$2" ;;
      esac
      shift ;;
    --) shift; pytest_args=("$@"); break ;;
    -h|--help) sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) fail "unknown option $1; accepted: --reuse, --torch-from V, --dir D, --python P, --triton VER, --" ;;
    *)
      if [[ -z "$torch_version" ]]; then torch_version="$1"
      elif [[ -z "$titans" ]]; then titans="$1"
      else fail "unexpected argument $1; usage: scripts/compat.sh TORCH_VERSION [0.2.2|0.3.0|both] [options] [-- PYTEST_ARGS]"
      fi ;;
  esac
  shift
done

[[ -n "$torch_version" ]] || fail "no torch version given; usage: scripts/compat.sh TORCH_VERSION [0.2.2|0.3.0|both] [options] [-- PYTEST_ARGS]"
[[ "$torch_version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] \
  || fail "torch version $torch_version is not a release number; accepted: X.Y.Z, e.g. 2.15.0"
case "${titans:-both}" in
  both) titans=(0.2.2 0.3.0) ;;
  0.2.2|0.3.0) titans=("$titans") ;;
  *) fail "TorchTitan $titans is not one this script runs; accepted: 0.2.2, 0.3.0, both" ;;
esac
[[ -n "$python" ]] && command -v "$python" >/dev/null \
  || fail "no Python interpreter ${python:-python3.11 or python3} on PATH; name one with --python P"
base_site=""
if [[ -n "$torch_from" ]]; then
  [[ -x "$torch_from/bin/python" ]] || fail "--torch-from $torch_from is not a venv (no bin/python)"
  base_site="$("$torch_from/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    || fail "cannot read the site-packages of $torch_from"
fi

# pip install ARGS into the venv of python $1, its whole output in $venv/pip.log: pip states
# why it refuses (e.g. "The user requested (constraint) torch<=2.14.1") at its INFO level,
# which -q would hide, so on a failure the log's last lines go to stderr before the sentence.
pip_install() {
  local py="$1" log="$venv/pip.log"
  shift
  "$py" -m pip install "$@" >>"$log" 2>&1 && return 0
  echo "compat: pip's last lines (whole output: $log):" >&2
  tail -n 20 "$log" >&2
  return 1
}

# The torch release a venv's python imports (local suffix such as +cpu dropped), and its
# TorchTitan; "none" for what is missing.
versions() {
  "$1" - <<'EOF' 2>/dev/null
import importlib.metadata as m
out = []
for name in ("torch", "torchtitan"):
    try:
        out.append(m.version(name).split("+")[0])
    except m.PackageNotFoundError:
        out.append("none")
print(*out)
EOF
}

build() {  # venv, TorchTitan: a fresh venv with torch first, then the rest
  local venv="$1" tt="$2" py="$1/bin/python"
  if [[ -e "$venv" ]]; then
    [[ -f "$venv/titan-rocm-compat" ]] \
      || fail "$venv exists and was not made by this script: remove it or choose another --dir"
    rm -rf -- "$venv"
  fi
  mkdir -p "$(dirname "$venv")" || fail "cannot create $(dirname "$venv")"
  "$python" -m venv "$venv" || fail "$python -m venv $venv failed"
  echo "made by scripts/compat.sh" > "$venv/titan-rocm-compat"
  if [[ -n "$base_site" ]]; then
    local site
    site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$base_site" > "$site/titan-rocm-compat-base.pth"
  else
    echo "compat: installing torch==$torch_version into $venv"
    pip_install "$py" "torch==$torch_version" \
      || fail "pip could not install torch==$torch_version (a constraints file capping torch? PIP_CONSTRAINT=/dev/null lifts it)"
  fi
  local have
  read -r have _ <<<"$(versions "$py")"
  [[ "$have" == "$torch_version" ]] \
    || fail "the venv imports torch $have, not $torch_version${torch_from:+ (from $torch_from)}"
  local extra=()
  "$py" -c 'import importlib.metadata as m, sys
sys.exit(any(r.startswith("triton") for r in m.requires("torch") or []))' && extra=("triton==$triton")
  echo "compat: installing ${extra[*]:+${extra[*]} }torchtitan==$tt and titan-rocm[test] into $venv"
  pip_install "$py" "${extra[@]}" "torchtitan==$tt" -e "$repo[test]" \
    || fail "pip could not install torchtitan==$tt and titan-rocm into $venv"
  read -r have _ <<<"$(versions "$py")"
  [[ "$have" == "$torch_version" ]] \
    || fail "installing TorchTitan's dependencies replaced torch $torch_version with $have (a constraints file capping torch? PIP_CONSTRAINT=/dev/null lifts it)"
  echo "torch=$torch_version torchtitan=$tt torch_from=$torch_from" > "$venv/titan-rocm-compat"
}

summaries=() status=0
for tt in "${titans[@]}"; do
  venv="$dir/torch-$torch_version-tt$tt"
  py="$venv/bin/python"
  if ((reuse)) && [[ -f "$venv/titan-rocm-compat" ]] \
      && [[ "$(versions "$py")" == "$torch_version $tt" ]]; then
    echo "compat: reusing $venv"
  else
    build "$venv" "$tt"
  fi
  marker=(-m torchtitan022)  # README's: the suite's marker, so slow tests run too
  [[ "$tt" == 0.3.0 ]] && marker=(-m torchtitan030)
  log="$venv/pytest.log"
  echo "compat: torch $torch_version + TorchTitan $tt: python -m pytest -q ${marker[*]} ${pytest_args[*]}"
  (cd "$repo" && PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" \
    "$py" -m pytest -q "${marker[@]}" "${pytest_args[@]}") 2>&1 | tee "$log"
  rc="${PIPESTATUS[0]}"
  # pytest's last line: "==== 1553 passed, 4 failed, 12 skipped in 812.3s ====" (-q: no bars)
  counts="$(grep -E '(passed|failed|error|skipped|no tests ran)' "$log" | tail -n 1 \
    | sed -E 's/^=+ //; s/ =+$//; s/ in [0-9.]+s( \([0-9:]+\))?$//')"
  summaries+=("compat: torch $torch_version + TorchTitan $tt: ${counts:-no pytest summary (exit $rc)} (log: $log)")
  ((rc == 0)) || status=1
done
printf '%s\n' "${summaries[@]}"
exit "$status"
