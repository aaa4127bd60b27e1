import pytest

from moneyfmt import format_money


def test_positive():
    assert format_money(1234.5) == "$1,234.50"


def test_currency_and_decimals():
    assert format_money(1000000, "EUR", 0) == "\u20ac1,000,000"
    assert format_money(3.14159, "xyz", 3) == "XYZ 3.142"


def test_negative_decimals_refused():
    with pytest.raises(ValueError):
        format_money(1, decimals=-1)
