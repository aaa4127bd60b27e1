"""The setup's hidden case: a random text and its word counts, printed as
the session data. The grader reads it back; the workspace never holds it."""

import json
import random
import re
from collections import Counter

rng = random.SystemRandom()
words = ["alpha", "Beta", "gamma", "delta", "Echo"]
text = ""
for _ in range(rng.randint(8, 16)):
    text += rng.choice(words) + rng.choice([" ", "  ", ", ", ". ", "! "])
counts = Counter(re.findall(r"[a-z]+", text.lower()))
print(json.dumps({"case": {"text": text, "counts": counts}}))
