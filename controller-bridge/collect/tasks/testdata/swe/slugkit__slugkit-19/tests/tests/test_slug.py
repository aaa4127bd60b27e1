from slugkit import slugify, unique_slug


def test_slugify():
    assert slugify("  Hello, World! ") == "hello-world"
    assert slugify("Caf\u00e9 cr\u00e8me", "_") == "cafe_creme"


def test_unique_slug_free():
    assert unique_slug("Hello World", set()) == "hello-world"


def test_unique_slug_one_taken():
    assert unique_slug("Hello World", {"hello-world"}) == "hello-world-2"


def test_unique_slug_many_taken():
    taken = {"post", "post-2", "post-3", "post-4"}
    assert unique_slug("Post", taken) == "post-5"


def test_unique_slug_gap():
    assert unique_slug("Post", {"post", "post-2", "post-3", "post-5"}) == "post-4"
