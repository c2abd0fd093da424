"""The package's version, apart from ``explore/__init__.py`` so that a module low in
the layers (the scheduler's measured constants are keyed by it) reads it without
importing the package's top (which imports the runner).

>>> __version__.count(".") == 2
True
"""

__version__ = "0.1.0"
