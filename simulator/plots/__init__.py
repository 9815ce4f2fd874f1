"""Plots of runs and sweeps (matplotlib figures, never shown, only saved or returned)."""
