"""explore: search spaces, packing scheduler and study analysis on top of ``engine``."""
