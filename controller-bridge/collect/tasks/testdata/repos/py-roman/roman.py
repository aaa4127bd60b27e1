"""Roman numerals."""

NUMERALS = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]


def to_roman(n):
    """Return n (1 to 3999) in Roman numerals, subtractive pairs included."""
    out = ""
    for value, letters in NUMERALS:
        while n >= value:
            out += letters
            n -= value
    return out
