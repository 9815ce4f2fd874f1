"""servesim: a discrete-event simulator of an LLM inference server."""

__version__ = "0.1.0"
