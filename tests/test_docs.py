"""The README and docs/ stay true: the README is short, every relative link resolves, every
project command a page shows (in a shell block, or inline code that starts with one) exists and
parses with its program's own parser, every repository path and exit status a page names is one
the code has, and docs/contract.md is what scripts/contract_doc.py generates.

Commands are parsed, not run (most train models or run a job for minutes): see
tests/doc_commands.py. The README's short path is run for real by tests/test_readme_path.py.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import subprocess

import pytest

from tests.doc_commands import (ROOT, check_commands, commands_in, documented_commands, packages, pages, read, rel,
                                shell_blocks, simple_commands, split_env)

README = os.path.join(ROOT, "README.md")
PAGES = pages()                 # README.md, deploy/README.md, docs/*.md
README_MAX_LINES = 215         # a page a newcomer reads top to bottom; the rest is in docs/


# ------------------------------------------------------------------ the README


def test_readme_is_short():
    lines = read(README).count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {README_MAX_LINES})"


def test_readme_gives_the_two_commands_and_both_test_tiers():
    text = read(README)
    assert "bash scripts/quickstart.sh" in text
    ci = [line for line in read(os.path.join(ROOT, ".ci", "run")).splitlines() if "pytest" in line]
    assert ci and ci[0].strip() in text, "the README's test command must be the one CI runs (.ci/run)"
    assert '-m "not slow"' in text, "the README must give the fast tier"


# ------------------------------------------------------------------ links


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than '-' and '_' dropped,
    spaces to '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: str) -> set[str]:
    anchors, seen = set(), {}
    in_code = False
    for line in read(path).splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(path: str) -> list[str]:
    text = re.sub(r"```.*?```", "", read(path), flags=re.S)        # not inside code blocks
    text = re.sub(r"`[^`\n]*`", "", text)                            # nor inline code
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_points_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in _links(page):
        if re.match(r"[a-z]+:", target):            # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(full):
            broken.append(f"{target}: no such file")
        elif anchor and full.endswith(".md") and anchor not in _anchors(full):
            broken.append(f"{target}: no heading #{anchor} in {rel(full)}")
    assert not broken, f"{rel(page)}: " + "; ".join(broken)


# ------------------------------------------------------------------ commands


def test_every_command_in_the_docs_exists():
    commands, missing = documented_commands()
    assert not missing, "\n".join(missing)
    names = {c.name for c in commands}
    assert {"python -m beam_pipelines.generate", "python -m beam_pipelines.filter",
            "python -m embeddings.train", "deploy/run_dask.sh", "deploy/run_flink.sh", "deploy/run_dataflow.sh",
            "paragen-refresh", "deploy/refresh.sh"} <= names, names


def test_every_project_command_runs_from_a_fresh_shell():
    """A command a reader copies into a new shell finds the project's Python: `.venv/bin/paragen-*`,
    `.venv/bin/python -m ...`, or a bare name after the page's `source .venv/bin/activate`."""
    bare = []
    for page in PAGES:
        activated = False
        for line, block in shell_blocks(page):
            activated = activated or "source .venv/bin/activate" in block
            for words in simple_commands(block):
                words = split_env(words)[1]
                if not words or activated:
                    continue
                project_python = (re.fullmatch(r"python(3(\.\d+)?)?", words[0]) and words[1:2] == ["-m"]
                                  and len(words) > 2 and words[2].split(".")[0] in packages())
                if words[0].startswith("paragen-") or project_python:
                    bare.append(f"{rel(page)}:{line}: {' '.join(words)[:80]}")
    assert not bare, "not found in a fresh shell (write .venv/bin/...):\n" + "\n".join(bare)


def test_every_command_in_the_docs_parses_with_its_programs_own_parser():
    """Each documented command line through its program's own argparse parser (types and choices
    included), a Beam job's other options through the Beam parser the job refuses unknown ones
    with, a launcher's through its own checks and then the job's: a renamed option, a value of the
    wrong type or an option given to the wrong command fails here until the docs follow."""
    commands, missing = documented_commands()
    problems = missing + check_commands(commands)
    assert not problems, "\n".join(problems)


WRONG = {   # command -> what the check must say about it
    ".venv/bin/paragen-generate --input a.tsv --output out --forward_model M --backward_model M --engine ctranslate2":
        "unknown option(s): --engine",
    ".venv/bin/paragen-generate --input a.tsv --output out --forward_model M --backward_model M "
    "--direct_num_workers abc":
        "--direct_num_workers: invalid int value: 'abc'",
    ".venv/bin/paragen-generate --input a.tsv --output out --forward_model M --backward_model M --runner NoRunner":
        "--runner NoRunner",
    ".venv/bin/paragen-generate --input a.tsv --output out --forward_model M --backward_model M --preset nope":
        "argument --preset: invalid choice: 'nope'",
    ".venv/bin/paragen-translate --model M --beam five": "argument --beam: invalid int value: 'five'",
    ".venv/bin/paragen-translate --beam 5": "the following arguments are required: --model",
    ".venv/bin/paragen-refresh --root R -- --input a.tsv --forward_model M --backward_model M --presett x":
        "[after --]: unknown option(s): --presett",
    ".venv/bin/paragen-refresh --root R --filter_args='--confg paranmt' -- --input a --forward_model M "
    "--backward_model M": "[--filter_args]: unknown option(s): --confg",
    "PROJECT=p REGION=r TEMP=gs://b/t IMAGE=i deploy/run_dataflow.sh --input corpus/ --output gs://b/o":
        "run_dataflow.sh: --input corpus/: Dataflow workers cannot read local paths",
    "deploy/run_dask.sh --local 2 --input a.tsv --output out --forward_model M --backward_model M --num-samples 4":
        "unknown option(s): --num-samples",
    ".venv/bin/python -m models.nmt.nosuch --x 1": "python -m models.nmt.nosuch: no such module",
    ".venv/bin/python bench/bench_nosuch.py": "bench/bench_nosuch.py: no such file",
}


def test_the_docs_check_finds_wrong_commands():
    """The check above, on commands that are wrong: each must be named with what is wrong."""
    commands, problems = [], []
    for i, text in enumerate(WRONG):
        found, missing = commands_in(text, f"wrong:{i}")
        commands += found
        problems += missing
    problems += check_commands(commands)
    for i, (text, expected) in enumerate(WRONG.items()):
        said = [p for p in problems if p.startswith(f"wrong:{i}:")]
        assert any(expected in p for p in said), f"{text}\nexpected {expected!r}, got {said}"
    right, _ = commands_in(".venv/bin/paragen-translate --model M --beam 5\n"
                           "deploy/run_dask.sh --local N --input a.tsv --output out --forward_model M "
                           "--backward_model M --slurm_extra --qos=long", "right")
    assert check_commands(right) == []


# ------------------------------------------------------------------ paths and exit statuses

TOP = sorted({p.split("/")[0] for p in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                                      check=True).stdout.splitlines() if "/" in p})
REPO_PATH = re.compile(r"(?<![\w./$'\"-])((?:%s)/[\w./*@-]*[\w*])" % "|".join(map(re.escape, TOP)))


def _names_something(path: str) -> bool:
    """PATH is a file or folder of the repository (a glob matches one), or `module/path.name`:
    a module file that defines NAME."""
    full = os.path.join(ROOT, path)
    if os.path.exists(full) or glob.glob(full):
        return True
    module, dot, name = path.rpartition(".")
    if dot and os.path.isfile(os.path.join(ROOT, module + ".py")):
        source = read(os.path.join(ROOT, module + ".py"))
        return re.search(rf"^\s*(def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*[:=]", source, re.M) is not None
    return False


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_repository_path_a_page_names_exists(page):
    """`deploy/slurm/cluster.sbatch`, `models/nmt/decoding/round_trips.count_device_ops`, `bench/*.py`: a
    path into the repository that a page names exists (a function reference, in the module named)."""
    text = read(page)
    wrong = [f"{rel(page)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)}"
             for m in REPO_PATH.finditer(text) if not _names_something(m.group(1))]
    assert not wrong, "no such file (or name) in the repository:\n" + "\n".join(wrong)


def _exit_statuses_of_the_code() -> set[int]:
    """Every exit status the project's code gives: constants named *EXIT* (EXIT_USAGE = 2,
    DEVICE_FAILURE_EXIT = 70), sys.exit/os._exit/exit with a number, JobFailed(..., N), `exit N` in
    its shell scripts; and 128 + the signal for a process ended by SIGINT, SIGTERM or SIGKILL (what
    the stop handler, a scheduler or the OOM killer gives)."""
    import signal

    found = {0, 128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGKILL}
    patterns = (r"\b[A-Z_]*EXIT[A-Z_]*\s*=\s*(\d+)", r"(?:sys\.exit|os\._exit|\bexit)\((\d+)\)",
                r"JobFailed\([^()]*(?:\([^()]*\)[^()]*)*,\s*(?:code=)?(\d+)\)", r"^\s*(?:[^#\n]*[;|&]\s*)?exit (\d+)")
    for path in subprocess.run(["git", "ls-files", "*.py", "*.sh", "*.sbatch"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.split():
        if path.startswith("tests/"):
            continue
        source = read(os.path.join(ROOT, path))
        for pattern in patterns:
            found |= {int(n) for n in re.findall(pattern, source, re.M)}
    return found


# "exit 75", "exits with status 1", "exit status 2 and 3", "exits 2, 3 or 1"
EXIT_MENTION = re.compile(r"\bexit(?:s|ed)?(?: with)?(?: (?:status|code)(?:es)?)?\s+\**(\d+)"
                          r"((?:\**,? (?:or |and )?\**\d+\**)*)", re.I)


def test_every_exit_status_the_docs_name_is_one_the_code_gives():
    known = _exit_statuses_of_the_code()
    assert {1, 2, 3, 75} <= known, known
    wrong = []
    for page in PAGES:
        text = read(page)
        for m in EXIT_MENTION.finditer(text):
            for number in [m.group(1), *re.findall(r"\d+", m.group(2))]:
                if int(number) not in known:
                    wrong.append(f"{rel(page)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    assert not wrong, f"exit statuses the code never gives (it gives {sorted(known)}):\n" + "\n".join(wrong)


# ------------------------------------------------------------------ the contract


def _contract_doc():
    spec = importlib.util.spec_from_file_location("contract_doc", os.path.join(ROOT, "scripts", "contract_doc.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_contract_doc_is_what_the_generator_writes():
    expected = _contract_doc().render()
    assert read(os.path.join(ROOT, "docs", "contract.md")) == expected, \
        "docs/contract.md is stale: .venv/bin/python scripts/contract_doc.py --write docs/contract.md"


def test_contract_doc_generator_refuses_a_key_without_a_meaning(monkeypatch):
    module = _contract_doc()
    monkeypatch.setitem(module.KEY_LISTS, "manifest", (*module.KEY_LISTS["manifest"], "new_key"))
    with pytest.raises(SystemExit, match="new_key"):
        module.key_table("manifest")


# ------------------------------------------------------------------ the models map


def test_the_models_map_names_every_module_of_models_and_nothing_else():
    """docs/architecture.md's tree of models/: each line's indentation is its depth; every module
    (but __init__.py) is in it, and everything in it exists."""
    text = read(os.path.join(ROOT, "docs", "architecture.md"))
    block = text.split("## The models map\n", 1)[1].split("```\n", 2)[1]
    named, stack = set(), []
    for line in block.splitlines():
        m = re.match(r"( *)([\w./]+(?:, [\w./]+)*)(?=\s{2,}|$)", line)
        if not m or not m.group(2).strip():
            continue                                    # a description's second line
        depth = len(m.group(1)) // 2
        names = m.group(2).split(", ")
        stack[depth:] = [names[0].rstrip("/")]
        for name in names:
            named.add("/".join(stack[:depth] + [name.rstrip("/")]))
    modules = {os.path.relpath(os.path.join(d, n), ROOT) for d, _, ns in os.walk(os.path.join(ROOT, "models"))
               for n in ns if n.endswith(".py") and n != "__init__.py"}
    folders = {os.path.dirname(p) for p in modules}
    assert not modules - named, f"modules the map leaves out: {sorted(modules - named)}"
    assert not named - modules - folders, f"the map names what does not exist: {sorted(named - modules - folders)}"
