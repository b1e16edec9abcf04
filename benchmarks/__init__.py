"""titan-rocm's benchmarks: one module per benchmark (``python -m benchmarks.<name>``), and
:mod:`benchmarks.harness`, what they share."""
