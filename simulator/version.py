"""The servesim version (in a module of its own: every other module may import it without
importing the package's face, ``simulator/__init__.py``, which imports the runner)."""

__version__ = "0.1.0"
