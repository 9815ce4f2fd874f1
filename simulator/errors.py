"""The one exception type that the CLI turns into a one-line message and exit code 2."""


class InputError(ValueError):
    """Bad user input: the message names the file, field or key and the reason, on one line."""
