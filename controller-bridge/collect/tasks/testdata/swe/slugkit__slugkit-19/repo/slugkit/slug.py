"""slugify and unique_slug."""

import re
import unicodedata


def slugify(title, separator="-"):
    """Lower-case ASCII letters and digits of title, words joined by
    separator."""
    text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    return separator.join(re.findall(r"[a-z0-9]+", text.lower()))


def unique_slug(title, taken, separator="-"):
    """The slug of title, or, if it is taken, the slug with the first
    free number from 2 on appended."""
    base = slugify(title, separator)
    if base not in taken:
        return base
    n = 2
    candidate = f"{base}{separator}{n}"
    if candidate in taken:
        n += 1
        candidate = f"{base}{separator}{n}"
    return candidate
