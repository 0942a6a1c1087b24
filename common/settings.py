"""Settings read from the environment ($PARAGEN_*), checked the same way everywhere: a value that
is not a number, or out of its range, is refused in one line naming the variable."""
from __future__ import annotations

import math
import os


def env_seconds(name: str, default: float, low: float, high: float, error: type[Exception]) -> float:
    """$NAME as seconds (DEFAULT when unset or empty), LOW <= value <= HIGH, else ERROR."""
    value = os.environ.get(name, "")
    try:
        seconds = float(value) if value else default
    except ValueError:
        raise error(f"{name}={value!r} is not a number of seconds") from None
    if not (math.isfinite(seconds) and low <= seconds <= high):
        raise error(f"{name}={value!r} must be between {low:g} and {high:g} seconds")
    return seconds


def progress_seconds(on_terminal: float = 5.0) -> float:
    """Seconds between progress lines: $PARAGEN_PROGRESS_SECONDS, else ON_TERMINAL when stderr is a
    terminal, 30 in a log. (A bad value falls back to the default: progress never ends a run.)"""
    import sys

    value = os.environ.get("PARAGEN_PROGRESS_SECONDS")
    if value:
        try:
            return max(0.1, float(value))
        except ValueError:
            pass
    return on_terminal if sys.stderr.isatty() else 30.0
