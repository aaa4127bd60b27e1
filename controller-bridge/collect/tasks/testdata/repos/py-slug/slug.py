"""URL slugs of titles."""

import re


def slugify(title):
    """Turn a title into a URL slug: lower-case letters and digits, words
    joined by single hyphens, nothing else."""
    words = re.split(r"\s+", title)
    return "-".join(words)
