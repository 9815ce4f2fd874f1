"""Validation against measured runs: readers of measured request timings (``measured.py``) and
the comparison of a simulation with them (``compare.py``); ``servesim compare`` prints it."""
