"""Config handling: the one start-up check of a run (startup.py: `check_run` -> `CheckedRun`, built from checks.py,
task_settings.py and env_ids.py) and what groups runs (grouping.py). trainer=debug is configuration (conf/debug/,
composed after the experiment preset), not code."""
