"""Config handling: start-up checks (checks.py), what groups runs (grouping.py) and trainer=debug (debug.py)."""
