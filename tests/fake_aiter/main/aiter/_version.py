__version__ = "0.1.21.dev0"  # a source build of aiter main after e4048607 (+g<commit> left out)
