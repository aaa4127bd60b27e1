import unittest

from slug import slugify


class TestSlugify(unittest.TestCase):
    def test_words(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_spaces(self):
        self.assertEqual(slugify("  Many   spaces "), "many-spaces")

    def test_punctuation(self):
        self.assertEqual(slugify("C'est la vie, 2024!"), "c-est-la-vie-2024")


if __name__ == "__main__":
    unittest.main()
