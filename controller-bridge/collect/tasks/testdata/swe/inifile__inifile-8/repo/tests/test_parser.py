import pytest

from inifile import ParseError, loads


def test_sections_and_keys():
    cfg = loads("[server]\nHost = example.com\nport=8080\n\n[client]\nretries = 3\n")
    assert cfg == {"server": {"host": "example.com", "port": "8080"}, "client": {"retries": "3"}}


def test_full_line_comments():
    assert loads("# top\n[a]\n; note\nk = v\n") == {"a": {"k": "v"}}


def test_bad_line():
    with pytest.raises(ParseError) as e:
        loads("[a]\njunk\n")
    assert e.value.lineno == 2
