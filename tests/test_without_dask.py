"""A job on a runner other than Dask starts where Dask is not installed (a GPU image with Beam and
fairseq carried in, a Dataflow worker): only beam_pipelines/dask_runner.py imports it. Found on a
lent GPU machine, where every job failed at its option parser's import of Beam's Dask runner."""
import json
import os
import subprocess
import sys

import pytest

from tests.jobs import quick_args
from tests.toydata import toy_bitext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# imported by every process of the job (sitecustomize): Dask, distributed and dask_jobqueue are absent
_NO_DASK = '''
import sys

class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("dask", "distributed", "dask_jobqueue"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Absent())
'''


@pytest.mark.slow
def test_the_generation_job_runs_on_the_direct_runner_without_dask(tmp_path, tiny_nmt_models):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_NO_DASK)
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    bitext = tmp_path / "toy.tsv"
    bitext.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(8, seed=4)))
    probe = subprocess.run([sys.executable, "-c", "import dask"], env=env, capture_output=True, text=True)
    assert probe.returncode == 1 and "No module named 'dask'" in probe.stderr        # the blocker works

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "beam_pipelines.generate", *quick_args(bitext, out, tiny_nmt_models)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.load(open(out / "_manifest.json"))
    assert manifest["runner"] == "DirectRunner" and manifest["counts"]["records_read"] == 8
    assert manifest["counts"]["reconciled"]

    refused = tmp_path / "refused"
    done = subprocess.run([sys.executable, "-m", "beam_pipelines.generate",
                           *quick_args(bitext, refused, tiny_nmt_models), "--runner", "DaskRunner"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
    assert "DaskRunner needs a Beam extra that is not installed" in errors[0] and "dask" in errors[0], errors
    assert not refused.exists()
