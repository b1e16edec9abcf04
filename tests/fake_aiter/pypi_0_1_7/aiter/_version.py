__version__ = "0.1.7.post2.dev18"
