import unittest

from roman import to_roman


class TestToRoman(unittest.TestCase):
    def test_additive(self):
        self.assertEqual(to_roman(3), "III")
        self.assertEqual(to_roman(2024), "MMXXIV")

    def test_subtractive(self):
        self.assertEqual(to_roman(4), "IV")
        self.assertEqual(to_roman(9), "IX")
        self.assertEqual(to_roman(1994), "MCMXCIV")


if __name__ == "__main__":
    unittest.main()
