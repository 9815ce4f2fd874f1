"""Scheduling: which sequences compute how many tokens in each step (no clock, no I/O)."""
