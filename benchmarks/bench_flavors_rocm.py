"""``benchmarks.bench_flavors`` plus titan-rocm's converter registration (one custom import)."""

import benchmarks.bench_flavors  # noqa: F401
import titan_rocm  # noqa: F401  - registers the rocm converters, as custom_import = "titan_rocm"
