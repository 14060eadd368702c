"""Config handling: start-up checks (checks.py) and what groups runs (grouping.py). trainer=debug is configuration
(conf/debug/, composed after the experiment preset), not code."""
