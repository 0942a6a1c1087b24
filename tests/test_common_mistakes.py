"""Every common mistake in scripts/common_mistakes.py exits 2 with one error line, no traceback,
writes nothing and runs nothing; docs/common-mistakes.md is that script's table (which the script
makes with fresh processes)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import common_mistakes  # noqa: E402


@pytest.mark.slow
def test_every_common_mistake_is_refused_cleanly(tiny_nmt_models):
    from tests import warm_python

    # each refusal a process forked from a warm interpreter (its imports done once, not 71 times);
    # tests/test_warm_python.py shows a refusal prints the same there as in a fresh process
    results = common_mistakes.run_all(tiny_nmt_models, launch=warm_python.run)
    assert len(results) == len(common_mistakes.CASES)
    bad = [r for r in results if not common_mistakes.ok(r)]
    assert not bad, bad
    # the committed table is the one this script makes: same mistakes, same messages
    committed = open(os.path.join(ROOT, "docs", "common-mistakes.md"), encoding="utf-8").read()
    for row in common_mistakes.markdown(results).splitlines()[6:]:
        assert row in committed, row
