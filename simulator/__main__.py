"""``python -m simulator`` is the ``servesim`` command."""

from simulator.cli import entry

entry()
