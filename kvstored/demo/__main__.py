"""``python -m kvstored.demo``: the same as ``kvstored demo``."""

from kvstored.demo.cli import demo

if __name__ == "__main__":
    demo()
