"""The package version, in a module of its own so that stage modules can record it without importing the package
root (whose `__init__` names every stage)."""

__version__ = "0.1.0"
