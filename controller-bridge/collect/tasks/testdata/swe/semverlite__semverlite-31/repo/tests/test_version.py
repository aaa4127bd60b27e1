import pytest

from semverlite import InvalidVersion, parse


def test_parse_and_str():
    assert str(parse("1.2.3")) == "1.2.3"
    assert str(parse(" 0.1.0-rc.1 ")) == "0.1.0-rc.1"


def test_invalid():
    with pytest.raises(InvalidVersion):
        parse("1.2")


def test_compare_single_digits():
    assert parse("1.2.3") < parse("1.3.0")
    assert parse("2.0.0") > parse("1.9.9")


def test_prerelease_first():
    assert parse("1.0.0-alpha") < parse("1.0.0")
