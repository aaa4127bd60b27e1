"""Shortening and wrapping of plain text."""

from .core import shorten, wrap_words
from .util import normalize_space

__all__ = ["shorten", "wrap_words", "normalize_space"]
__version__ = "0.3.1"
