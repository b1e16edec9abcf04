#!/bin/bash
# Downloads, on a CPU machine with PyPI, the wheels the GPU machine (Python 3.12, torch 2.11,
# triton 3.6, no network) lacks to run TorchTitan 0.3.0 and benchmarks/tt030_validation.py.
# Usage: bash benchmarks/fetch_tt030_wheels.sh .whl030   (git ignores /.whl030/; carry it)
# datasets 5.2.0 although torchtitan 0.3.0 asks <4.8: 4.x caps fsspec below the GPU image's
# version (as for 0.2.2); installed with --no-deps, nothing checks the pin at run time.
set -euo pipefail
dest=${1:-.whl030}
mkdir -p "$dest"
pkgs=(torchtitan==0.3.0 spmd_types==0.2.3 torchdata==0.11.0 datasets==5.2.0 dill==0.4.1
      multiprocess==0.70.19 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dest" "${pkgs[@]}" 2>&1 | grep -v "is ignored" || true
ls "$dest"
