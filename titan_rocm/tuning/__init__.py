"""Validated GEMM tuning (``titan-rocm tune``): problems, records, processes, tables.

Torch-free at import: :mod:`.problems`, :mod:`.records`, :mod:`.table`, :mod:`.runner`
(its main and workers) import no torch; :mod:`.choices`, :mod:`.minesweeper` and
:mod:`.collect` do. Docs: docs/validated-tuning.md.
"""
