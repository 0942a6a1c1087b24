"""The suite's own rules (docs/testing.md, "Rules that keep it passing on a loaded machine"),
checked on its source: a rule broken once by a new test comes back as a chance failure on a
loaded CI machine weeks later."""
import os
import re

TESTS = os.path.dirname(os.path.abspath(__file__))
# an asserted upper bound on a measured duration: `time.monotonic() - start < 30`, `seconds < 8`
_ELAPSED_BOUND = re.compile(r"assert\b.*(?:-\s*start\w*|\bseconds|\belapsed|\btook)\s*<\s*(\d+(?:\.\d+)?)")
# what a load cannot reach: a liveness bound a hundred times what the call takes, far below
# what the behaviour it rules out would take (a retry budget of an hour, 15 minutes of retries)
LIVENESS_SECONDS = 300


def elapsed_bounds(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every asserted duration bound under LIVENESS_SECONDS in TEXT."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)
            if (m := _ELAPSED_BOUND.search(line)) and float(m.group(1)) < LIVENESS_SECONDS]


def test_the_rule_finds_what_it_names():
    assert [n for n, _ in elapsed_bounds("assert rc == 1 and time.monotonic() - start < 30\n"
                                         "    assert seconds < 8, (seconds, err)\n"
                                         "assert time.time() < deadline\n"
                                         "assert 2 < time.monotonic() - start < 300\n"
                                         "assert len(rows) < 8\n")] == [1, 2]


def test_no_test_asserts_a_wall_clock_bound_that_load_can_break():
    found = []
    for name in sorted(os.listdir(TESTS)):
        if name.endswith(".py") and name != os.path.basename(__file__):
            with open(os.path.join(TESTS, name), encoding="utf-8") as f:
                found += [f"{name}:{n}: {line}" for n, line in elapsed_bounds(f.read())]
    assert not found, "check the behaviour, not how long it took (docs/testing.md):\n" + "\n".join(found)
