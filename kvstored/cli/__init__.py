"""Command-line entry points: ``kvstored`` (main.py) and ``kvstorectl`` (kvstorectl.py).

Only this package imports kvstored.cli; kvstorectl uses only the public client.

- ``cluster.py``: kvstorectl's cluster views (``where``, ``blocks --node``, ``evict``) on a master.
- ``ctl_common.py``: what kvstorectl's commands share (context, options, exit codes).
- ``kvstorectl.py``: ``kvstorectl``, the online admin CLI.
- ``main.py``: ``kvstored``, the daemon command group (``serve``, ``master``, ``node``, ...).
- ``output.py``: printers (rich tables for people, stable JSON for scripts).
- ``scheduler.py``: ``kvstorectl scheduler`` (the click command and its tables).
"""
