"""Calibration: fitting the ``fitted`` cost model to measured step times."""
