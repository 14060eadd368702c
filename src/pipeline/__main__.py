# Before anything heavy is imported: a SIGINT/SIGTERM in the first second ends the process (see rundir).
from pipeline.runtime.rundir import honour_stop_signals_from_now

honour_stop_signals_from_now()

from pipeline.cli import main  # noqa: E402 - after the signal handlers, on purpose

if __name__ == "__main__":
    main()
