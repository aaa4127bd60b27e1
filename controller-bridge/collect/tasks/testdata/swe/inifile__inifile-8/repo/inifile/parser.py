"""The parser."""

import re

_SECTION = re.compile(r"^\[([^\]]+)\]$")
_COMMENT_PREFIXES = ("#", ";")


class ParseError(ValueError):
    """A line that is neither a section, a key, a comment nor blank."""

    def __init__(self, lineno, line):
        super().__init__("line %d: cannot parse %r" % (lineno, line))
        self.lineno = lineno


def loads(text):
    """Parse INI text into {section: {key: value}}; keys before any
    section go into the section ""."""
    sections = {"": {}}
    current = sections[""]
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(_COMMENT_PREFIXES):
            continue
        m = _SECTION.match(line)
        if m:
            current = sections.setdefault(m.group(1).strip(), {})
            continue
        if "=" not in line:
            raise ParseError(lineno, raw)
        key, _, value = line.partition("=")
        current[key.strip().lower()] = value.strip()
    if not sections[""]:
        del sections[""]
    return sections


def load(path):
    """Parse the INI file at path."""
    with open(path, encoding="utf-8") as f:
        return loads(f.read())
