"""``python tests/tt030/tt030_cli_main.py ARGS``: ``titan-rocm ARGS`` in a process of its own
where TorchTitan 0.3.0's real trainer runs on CPU (the stand-ins of tt030_harness.py,
installed before TorchTitan loads). ``titan-rocm tune collect`` installs Inductor settings
for the whole process, so the 0.3.0 suite runs it here, not in pytest's process. Tests
only; ``tests/tt030`` on ``PYTHONPATH`` (for the harness and the test config modules)."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    import pytest
    from tt030_harness import Harness, force_cpu_device_type

    force_cpu_device_type()
    from pathlib import Path

    Harness.install(pytest.MonkeyPatch(), Path.cwd())
    from titan_rocm.cli import main

    sys.exit(main(sys.argv[1:]))
