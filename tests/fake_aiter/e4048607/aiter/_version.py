__version__ = "0.1.21.dev0+ge4048607"  # a source build of main e4048607
