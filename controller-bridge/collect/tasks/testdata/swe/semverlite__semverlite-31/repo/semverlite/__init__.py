"""Semantic versions: parse and compare."""

from .errors import InvalidVersion
from .version import Version, parse

__all__ = ["InvalidVersion", "Version", "parse"]
__version__ = "1.2.0"
