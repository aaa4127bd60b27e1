"""The Version type."""

import functools
import re

from .errors import InvalidVersion

_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?$")


@functools.total_ordering
class Version:
    """A semantic version. A version with a prerelease comes before the
    same version without one."""

    def __init__(self, major, minor, patch, prerelease=None):
        self.major, self.minor, self.patch = major, minor, patch
        self.prerelease = prerelease

    def __str__(self):
        core = "%s.%s.%s" % (self.major, self.minor, self.patch)
        return core + ("-" + self.prerelease if self.prerelease else "")

    def __repr__(self):
        return "Version(%r)" % str(self)

    def _key(self):
        return (self.major, self.minor, self.patch, self.prerelease is None, self.prerelease or "")

    def __eq__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self):
        return hash(self._key())


def parse(text):
    """Parse text as a semantic version."""
    m = _VERSION.match(text.strip())
    if not m:
        raise InvalidVersion("not a semantic version: %r" % text)
    major, minor, patch = m.group(1, 2, 3)
    return Version(major, minor, patch, m.group(4))
