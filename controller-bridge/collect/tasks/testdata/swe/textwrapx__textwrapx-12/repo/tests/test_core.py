import pytest

from textwrapx import shorten, wrap_words


def test_shorten_keeps_short_text():
    assert shorten("short", 10) == "short"


def test_shorten_collapses_space():
    assert shorten("  a \n b\t c ", 10) == "a b c"


def test_shorten_refuses_tiny_width():
    with pytest.raises(ValueError):
        shorten("anything", 2)


def test_wrap_words():
    assert wrap_words("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_long_word():
    assert wrap_words("a supercalifragilistic b", 5) == ["a", "supercalifragilistic", "b"]
