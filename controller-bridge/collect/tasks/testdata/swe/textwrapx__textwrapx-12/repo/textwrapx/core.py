"""shorten and wrap_words."""

from .util import normalize_space

DEFAULT_PLACEHOLDER = "..."


def shorten(text, width, placeholder=DEFAULT_PLACEHOLDER):
    """Collapse the whitespace of text and cut it to at most width
    characters, the placeholder included, when it is longer."""
    if width < len(placeholder):
        raise ValueError("width %d is smaller than the placeholder %r" % (width, placeholder))
    text = normalize_space(text)
    if len(text) <= width:
        return text
    return text[:width] + placeholder


def wrap_words(text, width):
    """Split text into lines of at most width characters, breaking between
    words; a word longer than width gets a line of its own."""
    lines, line = [], ""
    for word in normalize_space(text).split(" "):
        if not word:
            continue
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = line + " " + word if line else word
    if line:
        lines.append(line)
    return lines
