"""titan-rocm's tests (a package: helpers import as tests.support.<name>)."""
