"""What training reads of ``titan-rocm tune``'s results: the GEMM problems a job lowers
(:mod:`.problems`), the tuner's records (:mod:`.records`), the validated lookup table
(:mod:`.table`), Inductor's choices handler that serves it (:mod:`.choices`) and the
environment it reads (:mod:`.env`). The tuner itself (collect, run, the minesweeper) is
``titan_rocm.tuner``.

Torch-free at import: :mod:`.problems`, :mod:`.records` and :mod:`.table` import no torch;
:mod:`.choices` does. Docs: docs/validated-tuning.md.
"""
