import unittest

from stack import Stack


class TestStack(unittest.TestCase):
    def setUp(self):
        self.s = Stack()
        for x in (1, 2, 3):
            self.s.push(x)

    def test_pop(self):
        self.assertEqual(self.s.pop(), 3)
        self.assertEqual(self.s.pop(), 2)
        self.assertEqual(len(self.s), 1)

    def test_peek(self):
        self.assertEqual(self.s.peek(), 3)
        self.assertEqual(len(self.s), 3)


if __name__ == "__main__":
    unittest.main()
