"""Results on disk: output folders written atomically."""
