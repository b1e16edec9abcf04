"""``titan-rocm tune``'s driver: collect, run (the minesweeper and its workers); a tool
that may act as an adapter. What training reads of the tuning is ``titan_rocm.tuned_gemms``."""
