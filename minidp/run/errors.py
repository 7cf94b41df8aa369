"""The user errors of a run, in a module that imports nothing, so every layer may raise them."""


class UsageError(ValueError):
    """A user error that every rank raises alike (decided on rank 0 and broadcast)."""
