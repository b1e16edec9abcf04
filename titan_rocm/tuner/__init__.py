"""``titan-rocm tune``'s driver: collect, run (the minesweeper and its workers)."""
