"""The lifecycle of a run: config -> objects -> fit -> evaluate -> records (run.py), the job context, run-dir
ownership and stop requests, loggers, callbacks, devices and seeding."""
