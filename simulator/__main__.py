"""``python -m simulator`` is the ``servesim`` command."""

from simulator.command import entry

entry()
