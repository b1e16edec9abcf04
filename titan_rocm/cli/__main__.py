"""``python -m titan_rocm.cli``."""

from titan_rocm.cli import console_main

console_main()
