"""Currency symbols."""

SYMBOLS = {"USD": "$", "EUR": "\u20ac", "GBP": "\u00a3", "JPY": "\u00a5"}


def symbol_for(code):
    """The symbol of an ISO 4217 currency code, or the code and a space."""
    return SYMBOLS.get(code.upper(), code.upper() + " ")
