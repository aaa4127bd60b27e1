"""A small INI file reader."""

from .parser import ParseError, load, loads

__all__ = ["ParseError", "load", "loads"]
__version__ = "0.5.0"
