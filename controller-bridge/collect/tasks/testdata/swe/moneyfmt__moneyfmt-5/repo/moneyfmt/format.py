"""format_money."""

from .currency import symbol_for


def format_money(amount, currency="USD", decimals=2):
    """Format amount with the currency's symbol in front, a comma between
    thousands and the given number of decimals: -1234.5 is "-$1,234.50"."""
    if decimals < 0:
        raise ValueError("decimals must not be negative")
    symbol = symbol_for(currency)
    return symbol + f"{amount:,.{decimals}f}"
