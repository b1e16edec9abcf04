"""Replace the code block under README.md's ``## Layout`` with the moved layout (issue 23).

Fails, changing nothing, when the README has no such block (it was reworded on a branch):
then paste LAYOUT in by hand.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

LAYOUT = """```
titan_rocm/
  adapters/tt022/  TorchTitan 0.2.2's adapter: converters/ (`rocm`, `rocm.<name>`), config.py
                   ([rocm] JobConfig), train.py, plan.py, preflight.py (its start-up checks)
  adapters/tt030/  TorchTitan 0.3.0's adapter: rocm(cfg), RocmTrainer, configs, override, plan
  config.py, train.py, torchtitan/   the paths users type (shims of the modules above)
  workarounds/     base.py (Context, Workaround, the gate), job.py, registry.py, seams.py,
                   one package per fix (seams_tt022.py / seams_tt030.py where it reaches
                   into TorchTitan's code)
  scanner/         AMDGCN parser, hazard rules, cache scan (titan-rocm scan, rocm.triton_war)
  tuning/          what training reads of titan-rocm tune: problems, records, tables, choices
  tuner/           titan-rocm tune's driver: collect, run, minesweeper processes
  archs.py         what happens on each gfx architecture (one place)
  platform.py      platform facts (ROCm? which gfx? which Triton? aiter?), injectable in tests
  settings.py      the [rocm] settings: one Literal and one default per choice
  torchtitan_version.py  which TorchTitan generation is installed (from its API, not its version)
  logs/, gemm_tables/, numerics/   log checking, run comparison, GEMM tables, numerics audit
  testing/         test-only code (fault injection, graph audit); the runtime never imports it
  cli/             titan-rocm subcommands
configs/           ready TorchTitan TOML files     docs/   one page per workaround
tests/             unit/<package>/ (CPU), tt022/ (TorchTitan 0.2.2's trainer), tt030/ (the 0.3.0
                   suite), gpu/ (needs a GPU), support/ (helpers: tests.support.<name>)
benchmarks/        ratio-printing scripts
```"""


def main(path: str) -> int:
    readme = Path(path)
    text = readme.read_text(encoding="utf-8")
    pattern = re.compile(r"(## Layout\n\n)```\n.*?\n```", re.S)
    if not pattern.search(text):
        print(f"readme_layout.py: {path} has no code block under '## Layout'; paste the layout "
              "in by hand", file=sys.stderr)
        return 1
    readme.write_text(pattern.sub(lambda m: m.group(1) + LAYOUT, text, count=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
