import unittest

from wordfreq import count_words


class TestCountWords(unittest.TestCase):
    def test_case_and_punctuation(self):
        self.assertEqual(count_words("The cat and the hat."), {"the": 2, "cat": 1, "and": 1, "hat": 1})

    def test_spaces(self):
        self.assertEqual(count_words("  spaced   out "), {"spaced": 1, "out": 1})


if __name__ == "__main__":
    unittest.main()
