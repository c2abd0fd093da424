"""explore: search spaces, packing scheduler and study analysis on top of ``engine``."""

__version__ = "0.1.0"
