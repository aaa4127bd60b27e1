"""Word frequencies."""

from collections import Counter


def count_words(text):
    """Count the words of text, case-insensitively: a word is a run of
    letters a to z; spaces and punctuation are not part of any word."""
    return Counter(text.split(" "))
