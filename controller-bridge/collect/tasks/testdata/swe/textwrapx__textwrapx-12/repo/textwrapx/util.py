"""Whitespace helpers."""

import re

_SPACE = re.compile(r"\s+")


def normalize_space(text):
    """Collapse every run of whitespace in text into one space and strip
    both ends."""
    return _SPACE.sub(" ", text).strip()
