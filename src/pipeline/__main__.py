import sys

# Before anything heavy is imported: a SIGINT/SIGTERM in the first second ends the process (see rundir).
from pipeline.runtime.rundir import StoppedBeforeStart, honour_stop_signals_from_now

honour_stop_signals_from_now()
try:
    from pipeline.cli import main
except StoppedBeforeStart as exc:
    print(f"stopped by {exc} before the run started: no run record was written, nothing to resume", file=sys.stderr)
    sys.exit(exc.exit_code)

if __name__ == "__main__":
    main()
