"""A last-in, first-out stack."""


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        """Remove and return the item pushed last."""
        return self.items.pop(0)

    def peek(self):
        """Return the item pushed last, leaving it on the stack."""
        return self.items[0]

    def __len__(self):
        return len(self.items)
