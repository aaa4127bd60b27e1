"""Errors of semverlite."""


class InvalidVersion(ValueError):
    """A string that is not a semantic version."""
