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

