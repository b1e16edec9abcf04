__version__ = "0.1.21.dev46+ge4048607a5"  # setuptools_scm on main e4048607 (v0.1.20-46)
