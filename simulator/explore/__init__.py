"""Many runs at once: sweeps over scenario keys."""
