"""The README and docs/ stay true: the README is short, every relative link resolves, every
project command in a fenced shell block exists and accepts the options it is shown with, and
docs/contract.md is what scripts/contract_doc.py generates.

Commands are checked, not run (most train models or run a job for minutes): each distinct
program's ``--help`` must exit 0, and every ``--option`` the docs give it must appear in that help
(or, for the Beam jobs and the launchers that run them, be one of Beam's own options), so renaming
an option breaks this test until the docs follow.
"""
from __future__ import annotations

import ast
import concurrent.futures
import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = sorted(os.path.join(ROOT, "docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
              if name.endswith(".md"))
PAGES = [README, *DOCS]
PACKAGES = {d for d in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, d, "__init__.py"))}
SHELL_LANGS = {"bash", "sh", "shell", "console"}
BEAM_JOBS = ("beam_pipelines.generate", "beam_pipelines.filter")
README_MAX_LINES = 215         # a page a newcomer reads top to bottom; the rest is in docs/


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


# ------------------------------------------------------------------ the README


def test_readme_is_short():
    lines = _read(README).count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {README_MAX_LINES})"


def test_readme_gives_the_two_commands_and_both_test_tiers():
    text = _read(README)
    assert "bash scripts/quickstart.sh" in text
    ci = [line for line in _read(os.path.join(ROOT, ".ci", "run")).splitlines() if "pytest" in line]
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
    for line in _read(path).splitlines():
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
    text = re.sub(r"```.*?```", "", _read(path), flags=re.S)        # not inside code blocks
    text = re.sub(r"`[^`\n]*`", "", text)                            # nor inline code
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
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
            broken.append(f"{target}: no heading #{anchor} in {_rel(full)}")
    assert not broken, f"{_rel(page)}: " + "; ".join(broken)


# ------------------------------------------------------------------ commands


def _entry_points() -> dict[str, str]:
    """{console script: module} from setup.py."""
    tree = ast.parse(_read(os.path.join(ROOT, "setup.py")))
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"[\w-]+=[\w.]+:\w+",
                                                                                           node.value):
            name, target = node.value.split("=")
            out[name] = target.split(":")[0]
    return out


def _shell_blocks(path: str):
    """(first line number, text) of every fenced block labelled as shell."""
    lines = _read(path).splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"```(\w*)\s*$", lines[i])
        if m:
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if m.group(1) in SHELL_LANGS:
                yield i + 2, "\n".join(lines[i + 1:j])
            i = j
        i += 1


def _simple_commands(block: str):
    """The simple commands of a shell block: continuation lines joined, comments dropped, split at
    ; && || | & and shell keywords."""
    text = re.sub(r"\\\n", " ", block)
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for token in lexer:
            if set(token) <= set(";&|()"):
                if words:
                    yield words
                words = []
            elif not words and token in ("do", "then", "else", "done", "fi", "for", "while", "if"):
                continue
            else:
                words.append(token)
        if words:
            yield words


class MissingProgram(Exception):
    """A project command in the docs that does not exist."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise MissingProgram(message)


class Program:
    """A project program found in the docs: how to ask it for --help, and how to check options."""

    def __init__(self, name: str, argv: list[str], option_sources: tuple[str, ...] = ()):
        self.name, self.argv, self.option_sources = name, argv, option_sources


def _program(words: list[str], scripts: dict[str, str]):
    """(Program, options used, options used after '--') of a simple command, or None when it is
    not one of the project's commands. MissingProgram for a project command that does not exist."""
    env = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        key, value = words[0].split("=", 1)
        env[key] = value
        words = words[1:]
    if words[:1] == ["env"]:
        words = words[1:]
        while words and "=" in words[0]:
            env.update([words[0].split("=", 1)])
            words = words[1:]
    if not words:
        return None
    cmd, args = words[0], words[1:]
    if cmd in ("bash", "sh") and args and not args[0].startswith("-"):
        cmd, args = args[0], args[1:]
    base = os.path.basename(cmd)
    if base.startswith("paragen-"):
        _require(base in scripts, f"{base}: no such console script in setup.py")
        module = scripts[base]
        program = Program(base, [sys.executable, "-m", module], (module,))
    elif re.fullmatch(r"python(3(\.\d+)?)?", base):
        if args[:1] == ["-m"] and len(args) > 1:
            module, args = args[1], args[2:]
            if module.split(".")[0] not in PACKAGES:
                return None                             # pytest, pip, ...: not the project's
            _require(importlib.util.find_spec(module) is not None, f"python -m {module}: no such module")
            program = Program(f"python -m {module}", [sys.executable, "-m", module], (module,))
        elif args and args[0].endswith(".py"):
            script, args = args[0], args[1:]
            if not script.startswith(("bench/", "scripts/")):
                return None
            _require(os.path.isfile(os.path.join(ROOT, script)), f"{script}: no such file")
            program = Program(script, [sys.executable, script])
        else:
            return None
    elif cmd.startswith(("deploy/", "scripts/")):
        _require(os.path.isfile(os.path.join(ROOT, cmd)), f"{cmd}: no such file")
        if not cmd.startswith("deploy/run_") and cmd != "deploy/refresh.sh":
            return None                                 # bootstrap.sh, quickstart.sh: run by CI, no --help
        job = "beam_pipelines.filter" if env.get("JOB") == "filter" else "beam_pipelines.generate"
        program = Program(cmd, ["bash", cmd], (job,))
    else:
        return None
    options = [a.strip("[]").split("=", 1)[0] for a in args]
    if "--" in args:
        at = args.index("--")
        before = [o for o in options[:at] if o.startswith("--") and o != "--"]
        after = [o for o in options[at + 1:] if o.startswith("--")]
    else:
        before, after = [o for o in options if o.startswith("--")], []
    return program, before, after


def _commands():
    """[(where, Program, options, options after '--')] of every project command in the docs."""
    scripts = _entry_points()
    found = []
    for page in PAGES:
        for line, block in _shell_blocks(page):
            for words in _simple_commands(block):
                where = f"{_rel(page)}:{line}: {' '.join(words)[:100]}"
                try:
                    parsed = _program(words, scripts)
                except MissingProgram as exc:
                    found.append((where, exc, [], []))
                    continue
                if parsed:
                    found.append((where, *parsed))
    return found


def _help(argv: list[str]) -> tuple[int, str]:
    proc = subprocess.run([*argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    return proc.returncode, proc.stdout + proc.stderr


def _beam_options() -> set[str]:
    """Every option Beam's registered PipelineOptions know (what the Beam jobs pass through)."""
    code = ("import apache_beam.runners.dask.dask_runner\n"
            "from apache_beam.options.pipeline_options import PipelineOptions\n"
            "print('\\n'.join(PipelineOptions([]).get_all_options()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return {f"--{name}" for name in out.stdout.split()}


def test_every_command_in_the_docs_exists():
    commands = _commands()
    missing = [f"{where}: {problem}" for where, problem, _o, _a in commands if isinstance(problem, MissingProgram)]
    assert not missing, "\n".join(missing)
    names = {p.name for _where, p, _o, _a in commands}
    assert {"python -m beam_pipelines.generate", "python -m beam_pipelines.filter",
            "python -m embeddings.train"} <= names, names


def test_every_project_command_runs_from_a_fresh_shell():
    """A command a reader copies into a new shell finds the project's Python: `.venv/bin/paragen-*`,
    `.venv/bin/python -m ...`, or a bare name after the page's `source .venv/bin/activate`."""
    bare = []
    for page in PAGES:
        activated = False
        for line, block in _shell_blocks(page):
            activated = activated or "source .venv/bin/activate" in block
            for words in _simple_commands(block):
                while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                    words = words[1:]
                if not words or activated:
                    continue
                project_python = (re.fullmatch(r"python(3(\.\d+)?)?", words[0]) and words[1:2] == ["-m"]
                                  and len(words) > 2 and words[2].split(".")[0] in PACKAGES)
                if words[0].startswith("paragen-") or project_python:
                    bare.append(f"{_rel(page)}:{line}: {' '.join(words)[:80]}")
    assert not bare, "not found in a fresh shell (write .venv/bin/...):\n" + "\n".join(bare)


@pytest.mark.slow
def test_every_command_in_the_docs_exists_and_takes_its_options():
    commands = _commands()
    missing = [f"{where}: {problem}" for where, problem, _o, _a in commands if isinstance(problem, MissingProgram)]
    programs = [p for _where, p, _o, _a in commands if isinstance(p, Program)]
    argvs = {tuple(p.argv) for p in programs}
    argvs |= {(sys.executable, "-m", m) for p in programs for m in p.option_sources}
    argvs.add((sys.executable, "-m", "beam_pipelines.generate"))        # what paragen-refresh passes on after --
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        futures = {argv: pool.submit(_help, list(argv)) for argv in sorted(argvs)}
        beam = pool.submit(_beam_options)
        helped = {argv: future.result() for argv, future in futures.items()}
        beam_options = beam.result()
    problems = list(missing)
    problems += [f"{' '.join(argv[1:] if argv[0] == sys.executable else argv)} --help exits {rc}: {out[-300:]}"
                 for argv, (rc, out) in helped.items() if rc != 0]

    def known(option: str, texts: list[str], beam_ok: bool) -> bool:
        pattern = re.compile(re.escape(option) + r"(?![\w-])")
        return any(pattern.search(t) for t in texts) or (beam_ok and option in beam_options)

    for where, program, options, after in commands:
        if not isinstance(program, Program):
            continue
        texts = [helped[tuple(program.argv)][1]] + [helped[(sys.executable, "-m", m)][1]
                                                    for m in program.option_sources]
        beam_ok = any(m in BEAM_JOBS for m in program.option_sources)
        for option in options:
            if not known(option, texts, beam_ok):
                problems.append(f"{where}: {program.name} has no option {option}")
        job = helped[(sys.executable, "-m", "beam_pipelines.generate")][1]
        for option in after:                            # paragen-refresh ... -- <the generation job's options>
            if not known(option, [job], True):
                problems.append(f"{where}: the generation job has no option {option}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ the contract


def _contract_doc():
    spec = importlib.util.spec_from_file_location("contract_doc", os.path.join(ROOT, "scripts", "contract_doc.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_contract_doc_is_what_the_generator_writes():
    expected = _contract_doc().render()
    assert _read(os.path.join(ROOT, "docs", "contract.md")) == expected, \
        "docs/contract.md is stale: .venv/bin/python scripts/contract_doc.py --write docs/contract.md"


def test_contract_doc_generator_refuses_a_key_without_a_meaning(monkeypatch):
    module = _contract_doc()
    monkeypatch.setitem(module.KEY_LISTS, "manifest", (*module.KEY_LISTS["manifest"], "new_key"))
    with pytest.raises(SystemExit, match="new_key"):
        module.key_table("manifest")
