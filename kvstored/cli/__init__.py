"""Command-line entry points: ``kvstored`` (main.py) and ``kvstorectl`` (kvstorectl.py)."""
