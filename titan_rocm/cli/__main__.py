"""``python -m titan_rocm.cli``."""

import sys

from titan_rocm.cli import main

sys.exit(main())
