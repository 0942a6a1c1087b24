"""Deployment scripts: valid shell, usable --help, and refresh.sh semantics with a stand-in job."""
import configparser
import glob
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "deploy", "*.sh")))


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_script_syntax_strict_mode_and_help(script):
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    assert "set -euo pipefail" in open(script).read()
    done = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0 and "usage:" in done.stdout


def test_systemd_units_parse():
    for name, keys in (("paragen-refresh.service", [("Service", "ExecStart"), ("Service", "Type")]),
                       ("paragen-refresh.timer", [("Timer", "OnCalendar"), ("Install", "WantedBy")])):
        cp = configparser.ConfigParser(strict=False)
        cp.optionxform = str
        cp.read(os.path.join(ROOT, "deploy", name))
        for section, key in keys:
            assert cp.get(section, key)


def _refresh(tmp_path, run_id, job, keep=2):
    env = {**os.environ, "OUT_ROOT": str(tmp_path), "RUN_ID": run_id, "KEEP": str(keep), "PARAGEN_JOB_CMD": job}
    return subprocess.run(["bash", os.path.join(ROOT, "deploy", "refresh.sh"), "--input", "x"],
                          env=env, capture_output=True, text=True, timeout=30)


def test_refresh_moves_latest_only_on_success_and_prunes(tmp_path):
    ok = "python3 -c \"import sys,os; o=sys.argv[sys.argv.index('--output')+1]; os.makedirs(o); open(o+'/_manifest.json','w').write('{}')\""
    for day in ("2026-01-01", "2026-01-08", "2026-01-15"):
        assert _refresh(tmp_path, day, ok).returncode == 0
    assert os.readlink(tmp_path / "latest") == "2026-01-15"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir() and not p.is_symlink() and p.name != "logs") == \
        ["2026-01-08", "2026-01-15"]
    failed = _refresh(tmp_path, "2026-01-22", "false")
    assert failed.returncode != 0 and os.readlink(tmp_path / "latest") == "2026-01-15"
    assert (tmp_path / "logs" / "2026-01-22.log").exists()
