"""models/nmt/model_files/fairseq_import.py: fairseq imported without scikit-learn, pandas and
scipy.stats, its code that calls them still working, and the real modules for anyone importing
them later. Each case runs in a fresh interpreter: the import state of the test process is not
the one a job starts with."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_fairseq_comes_without_sklearn_and_what_called_them_still_works():
    out = _python("""
import sys
from models.nmt.model_files.fairseq_import import import_fairseq
fairseq = import_fairseq()
assert import_fairseq() is fairseq
print(sorted(m for m in ("sklearn", "sklearn.metrics", "pandas", "scipy.stats") if m in sys.modules))
from fairseq.criterions import sentence_prediction as sp
from fairseq.tasks import audio_classification as ac
print(sp.f1_score([0, 1, 1], [0, 1, 0]), round(sp._matthews_corrcoef([0, 1, 1, 0], [0, 1, 1, 0]), 3))
print(round(float(sp.pearsonr([1, 2, 3], [2, 4, 7])[0]), 3))
print(ac.sklearn_metrics.accuracy_score([1, 0], [1, 1]))
import sklearn.metrics, scipy.stats
print(hasattr(sklearn.metrics, "__file__"), hasattr(scipy.stats, "__file__"))
""").split("\n")
    assert out[0] == "[]"                                   # none of them loaded by the import itself
    assert out[1:5] == ["0.6666666666666666 1.0", "0.993", "0.5", "True True"]


def test_a_process_that_already_has_sklearn_keeps_it():
    out = _python("""
import sklearn.metrics
from models.nmt.model_files.fairseq_import import import_fairseq
import_fairseq()
from fairseq.criterions import sentence_prediction as sp
print(sp.f1_score is sklearn.metrics.f1_score)
""")
    assert out.strip() == "True"
