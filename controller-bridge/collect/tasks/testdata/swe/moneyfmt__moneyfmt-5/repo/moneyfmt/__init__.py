"""Format amounts of money."""

from .currency import SYMBOLS, symbol_for
from .format import format_money

__all__ = ["SYMBOLS", "format_money", "symbol_for"]
__version__ = "2.0.1"
