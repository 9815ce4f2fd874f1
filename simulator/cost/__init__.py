"""Cost models: how long one step takes on the GPU(s); their presets and calibration."""
