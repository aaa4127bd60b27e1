"""The grader: the visible tests, and the hidden case the setup put in the
session data. It prints the reward, the share of checks that pass."""

import json
import os
import sys
import unittest

sys.path.insert(0, os.getcwd())
data = json.loads(os.environ.get("STILLPOINT_SESSION_DATA", "{}"))
suite = unittest.defaultTestLoader.discover(".", pattern="test_*.py")
result = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
total = result.testsRun
passed = total - len(result.failures) - len(result.errors)
hidden = False
case = data.get("case")
if case:
    total += 1
    try:
        from wordfreq import count_words

        hidden = dict(count_words(case["text"])) == case["counts"]
    except Exception as e:  # the agent's code may raise anything
        print("hidden case: %r" % (e,), file=sys.stderr)
    passed += int(hidden)
print(json.dumps({"reward": passed / total if total else 0.0, "passed": passed, "total": total, "hidden": hidden}))
