"""The error an engine that can no longer run work raises: the AsyncEngine after shutdown, and
a distributed group whose ranks failed (runtime/distributed/group.py). A module of its own,
below both, so the group need not import the AsyncEngine for it."""


class EngineClosed(RuntimeError):
    """The AsyncEngine was shut down (or its thread died) before the call could run."""
