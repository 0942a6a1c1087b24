"""What every progress line shares, the workers' (transforms/progress.py) and the driver's
(paracorpus/run_progress.py): how often one comes, and how a duration reads in it."""
from __future__ import annotations

import os
import sys


def progress_seconds(on_terminal: float = 5.0) -> float:
    """Seconds between progress lines: $PARAGEN_PROGRESS_SECONDS, else ON_TERMINAL when stderr is a
    terminal, 30 in a log. (A bad value falls back to the default: progress never ends a run.)"""
    value = os.environ.get("PARAGEN_PROGRESS_SECONDS")
    if value:
        try:
            return max(0.1, float(value))
        except ValueError:
            pass
    return on_terminal if sys.stderr.isatty() else 30.0


def format_seconds(seconds: float) -> str:
    """A duration as a progress line says it: 42s, 7m40s, 3h05m."""
    seconds = int(max(0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
