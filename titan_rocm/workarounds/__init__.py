"""The workarounds: one package (or module) each, on the base in :mod:`.base`.

``registry`` lists them by name in apply order; ``moe_blocks`` holds the block facts several
of them share. Nothing here imports a TorchTitan config or titan-rocm's converters: the
TorchTitan adapters (``titan_rocm.adapters.tt022.converters`` for 0.2.2) stand above this package.
"""
