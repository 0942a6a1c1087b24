"""The README's path after the quickstart, as printed: its generation, filter and embedding
commands copied from README.md and run in a fresh shell in a folder laid out as
scripts/quickstart.sh leaves it (runs/example-models, runs/example-input.tsv; the tiny test
models and 60 toy pairs stand in for the quickstart's), one after the other, each reading what
the one before wrote."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _block(section: str) -> str:
    """The first ```bash block under README.md's heading SECTION, continuation lines joined."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", body, re.S).group(1)
    return block.replace("\\\n", " ")


def _run(cwd, command: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_the_readme_path_from_the_quickstarts_output_to_a_filtered_corpus_and_an_encoder(tiny_nmt_models, tmp_path):
    from tests.toydata import toy_bitext

    os.symlink(os.path.join(ROOT, ".venv"), tmp_path / ".venv")
    (tmp_path / "runs").mkdir()
    os.symlink(tiny_nmt_models, tmp_path / "runs" / "example-models")
    (tmp_path / "runs" / "example-input.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(60, seed=5)))

    generate = _block("The generation job")
    done = _run(tmp_path, generate)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "runs" / "example-output" / "_manifest.json").exists()
    again = _run(tmp_path, generate)                        # "the same command again has nothing to do"
    assert again.returncode == 0 and again.stdout.startswith("nothing to do: run "), again.stdout[-2000:]

    done = _run(tmp_path, _block("The filter job"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "runs" / "example-filtered" / "_filter_manifest.json").exists()

    done = _run(tmp_path, _block("The embedding job"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "runs" / "example-encoder" / "config.json").exists()
