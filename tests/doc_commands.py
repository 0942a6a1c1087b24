"""The project commands the docs show, and whether each one's own parser takes it as written.

Two halves:
- in the test process: find every command line in README.md and docs/*.md that names a project
  program (fenced shell blocks, and inline code that starts with one), and run the launchers
  (deploy/*.sh) for real with $PYTHON pointing at a recorder, so that their own checks run and the
  command line they would hand to the job is what gets checked;
- `python -m tests.doc_commands` (a separate process: the programs configure logging and signal
  handlers): for each command, call the program's own entry point and stop it at its first
  argparse call, then parse the documented arguments with that parser, its types and choices
  included, and hand a Beam job's remaining arguments to the Beam parser the job itself uses.
  Nothing is run past the parse.

Placeholders are allowed where a value goes: `DIR`, `$MODELS/cs-en`, `<run id>`, `...` (options
left out: required options are then not required).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELL_LANGS = {"bash", "sh", "shell", "console"}
BEAM_JOBS = ("beam_pipelines.generate", "beam_pipelines.filter")
GENERATED = ("common-mistakes.md",)     # mistakes on purpose, each run by scripts/common_mistakes.py
KEYWORDS = ("do", "then", "else", "done", "fi", "for", "while", "if")


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def pages() -> list[str]:
    docs = os.path.join(ROOT, "docs")
    return [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "deploy", "README.md"),
            *sorted(os.path.join(docs, name) for name in os.listdir(docs) if name.endswith(".md"))]


@functools.lru_cache(maxsize=None)
def packages() -> frozenset[str]:
    return frozenset({d for d in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, d, "__init__.py"))})


@functools.lru_cache(maxsize=None)
def entry_points() -> dict[str, str]:
    """{console script: 'module:function'} from setup.py."""
    import ast

    out = {}
    for node in ast.walk(ast.parse(read(os.path.join(ROOT, "setup.py")))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                re.fullmatch(r"[\w-]+=[\w.]+:\w+", node.value):
            name, target = node.value.split("=")
            out[name] = target
    return out


# ------------------------------------------------------------------ finding commands


def shell_blocks(path: str):
    """(first line number, text) of every fenced block labelled as shell."""
    lines = read(path).splitlines()
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


def inline_commands(path: str):
    """(line number, text) of inline code outside fenced blocks that starts with a project program
    (after environment assignments): `paragen-generate --preset parabank2`."""
    program = (r"(?:\.venv/bin/)?(?:paragen-[a-z-]+|python3? -m [\w.]+|python3? (?:bench|scripts)/\w+\.py"
               r"|(?:bash )?(?:deploy/run_\w+|deploy/refresh|scripts/\w+)\.sh|bench/\w+\.py)")
    starts = re.compile(r"(?:[A-Z_][A-Z0-9_]*=\S*\s+)*" + program + r"\s+\S")     # a program and an argument
    in_code = False
    for number, line in enumerate(read(path).splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for span in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", line):
            if starts.match(span):
                yield number, span


def simple_commands(block: str):
    """The simple commands of shell text: continuation lines joined, comments dropped, split at
    ; && || | & ( ) and shell keywords."""
    text = re.sub(r"\\\n", " ", block)
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        try:
            tokens = list(lexer)
        except ValueError:                      # an unclosed quote: not a command line
            continue
        for token in tokens:
            if set(token) <= set(";&|()"):
                if words:
                    yield words
                words = []
            elif not words and token in KEYWORDS:
                continue
            else:
                words.append(token)
        if words:
            yield words


def split_env(words: list[str]) -> tuple[dict, list[str]]:
    """({NAME: value} of leading assignments and `env NAME=value`, the rest)."""
    env = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        key, value = words[0].split("=", 1)
        env[key] = value
        words = words[1:]
    if words[:1] == ["env"]:
        words = words[1:]
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            key, value = words[0].split("=", 1)
            env[key] = value
            words = words[1:]
    return env, words


class Command:
    """One documented command: WHERE it is, the program (KIND 'module', 'script' or 'launcher',
    TARGET a module, a script path or a launcher path), its arguments and environment."""

    def __init__(self, where: str, kind: str, target: str, args: list[str], env: dict, name: str):
        self.where, self.kind, self.target, self.args, self.env, self.name = where, kind, target, args, env, name

    def as_json(self) -> dict:
        return {"where": self.where, "kind": self.kind, "target": self.target, "args": self.args, "env": self.env}


def identify(words: list[str], where: str, scripts: dict[str, str], pkgs: set[str]):
    """The Command of a simple command's WORDS, None when it is not a project program, or a string
    saying which project program does not exist."""
    env, words = split_env(words)
    if not words:
        return None
    cmd, args = words[0], words[1:]
    if cmd in ("bash", "sh") and args and not args[0].startswith("-"):
        cmd, args = args[0], args[1:]
    base = os.path.basename(cmd)
    if base.startswith("paragen-"):
        if base not in scripts:
            return f"{where}: {base}: no such console script in setup.py"
        return Command(where, "module", scripts[base], args, env, base)
    if re.fullmatch(r"python(3(\.\d+)?)?", base):
        if args[:1] == ["-m"] and len(args) > 1:
            module = args[1]
            if module.split(".")[0] not in pkgs:
                return None                             # pytest, pip, ...: not the project's
            if importlib.util.find_spec(module) is None:
                return f"{where}: python -m {module}: no such module"
            return Command(where, "module", module, args[2:], env, f"python -m {module}")
        if args and args[0].startswith(("bench/", "scripts/")) and args[0].endswith(".py"):
            if not os.path.isfile(os.path.join(ROOT, args[0])):
                return f"{where}: {args[0]}: no such file"
            return Command(where, "script", args[0], args[1:], env, args[0])
        return None
    if cmd.startswith(("deploy/", "scripts/", "bench/")):
        if not os.path.isfile(os.path.join(ROOT, cmd)):
            return f"{where}: {cmd}: no such file"
        if cmd.endswith(".py"):
            return Command(where, "script", cmd, args, env, cmd)
        if cmd.startswith("deploy/run_") or cmd == "deploy/refresh.sh":
            return Command(where, "launcher", cmd, args, env, cmd)
    return None                                         # bootstrap.sh, quickstart.sh: run by CI


def commands_in(text: str, where: str, inline: bool = False) -> tuple[list[Command], list[str]]:
    """(the project commands of shell TEXT, the project programs it names that do not exist);
    INLINE: text from inline code, which shows a few options of a command, not all."""
    found, missing = [], []
    for words in simple_commands(text):
        got = identify(words, f"{where}: {' '.join(words)[:90]}", entry_points(), packages())
        if isinstance(got, str):
            missing.append(got)
        elif got is not None:
            if inline and "..." not in got.args:
                got.args.append("...")
            found.append(got)
    return found, missing


def documented_commands() -> tuple[list[Command], list[str]]:
    """(every project command in the docs, the project programs named that do not exist)."""
    found, missing = [], []
    for page in pages():
        if os.path.basename(page) in GENERATED:
            continue
        sources = [(line, block, False) for line, block in shell_blocks(page)]
        sources += [(line, span, True) for line, span in inline_commands(page)]
        for line, text, inline in sources:
            more, absent = commands_in(text, f"{rel(page)}:{line}", inline)
            found += more
            missing += absent
    return found, missing


# ------------------------------------------------------------------ launchers

RECORDER = r'''
import json, os, sys
args = sys.argv[1:]
def value(name):
    return args[args.index(name) + 1]
if args[:2] == ["-m", "distributed.cli.dask_scheduler"]:      # run_dask.sh --local: no cluster needed
    json.dump({"address": "tcp://127.0.0.1:8786"}, open(value("--scheduler-file"), "w"))
    sys.exit(0)
if args[:2] == ["-m", "distributed.cli.dask_worker"]:
    sys.exit(0)
if (args[:1] == ["-m"] and args[1].startswith("beam_pipelines.")) or args[:1] == ["deploy/portable_local.py"]:
    json.dump(args, open(os.environ["DOC_COMMAND_RECORD"], "w"))
    sys.exit(0)
os.execv(sys.executable, [sys.executable, *args])
'''


# what a launcher shown with a few of its settings (`GPUS=K deploy/run_flink.sh ...`) is given
# besides, so that the settings it shows are the ones checked
LAUNCHER_SETTINGS = {"DASK_SCHEDULER": "tcp://scheduler:8786", "FLINK_MASTER": "flink:8081", "PROJECT": "p",
                     "REGION": "r", "TEMP": "gs://b/tmp", "IMAGE": "image:tag", "OUT_ROOT": "gs://b/root"}


def _count(value: str) -> str:
    """A one-letter placeholder (`--local N`, `GPUS=K`) as a number a launcher takes."""
    return "2" if re.fullmatch(r"[A-Z]", value) else value


def resolve_launcher(command: Command, workdir: str) -> Command | str:
    """Run the launcher as documented, with $PYTHON a recorder: its own checks run for real, and
    the job command line it would run comes back as a Command (or a string saying what failed)."""
    recorder = os.path.join(workdir, "python")
    if not os.path.exists(recorder):
        with open(recorder, "w") as f:
            f.write(f"#!{sys.executable}\n{RECORDER}")
        os.chmod(recorder, 0o755)
    record = os.path.join(workdir, "record.json")
    if os.path.exists(record):
        os.remove(record)
    partial = "..." in command.args
    env = {**os.environ, **(LAUNCHER_SETTINGS if partial else {}), **{k: _count(v) for k, v in command.env.items()},
           "PYTHON": recorder, "DOC_COMMAND_RECORD": record}
    args = [_count(a) for a in command.args if a != "..."]
    done = subprocess.run(["bash", command.target, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0 or not os.path.exists(record):
        return f"{command.where}: {command.target} exits {done.returncode}: {done.stderr.strip()[-300:]}"
    with open(record) as f:
        argv = json.load(f)
    if argv[0] == "deploy/portable_local.py":
        module, job_args = f"beam_pipelines.{argv[1]}", argv[2:]
    else:
        module, job_args = argv[1], argv[2:]
    if "..." in command.args:
        job_args.append("...")
    return Command(command.where, "module", module, job_args, command.env, command.name)


# ------------------------------------------------------------------ the parse (its own process)


class _Parsed(BaseException):
    """Raised by the first argparse call of a program: its parser and the arguments it was given."""

    def __init__(self, parser: argparse.ArgumentParser, args: list[str] | None):
        super().__init__()
        self.parser, self.args = parser, args


class _ParseError(Exception):
    pass


REAL_PARSE_ARGS = argparse.ArgumentParser.parse_args
REAL_PARSE_KNOWN_ARGS = argparse.ArgumentParser.parse_known_args


@contextlib.contextmanager
def _first_parse_stops():
    def stop(self, args=None, namespace=None):
        raise _Parsed(self, list(sys.argv[1:] if args is None else args))
    argparse.ArgumentParser.parse_args = stop
    argparse.ArgumentParser.parse_known_args = stop
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = REAL_PARSE_ARGS
        argparse.ArgumentParser.parse_known_args = REAL_PARSE_KNOWN_ARGS


PLACEHOLDER = re.compile(r"\.\.\.|.*\$\{?\w|.*<[^>]*>|[A-Z][A-Z0-9_]*(/.*)?")


def _is_placeholder(value: str) -> bool:
    return bool(PLACEHOLDER.fullmatch(value))


def _fill(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """ARGS with each placeholder value of an option replaced by one its type and choices take."""
    actions = parser._option_string_actions
    out = []
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if eq and name in actions and _is_placeholder(value):
            out.append(f"{name}={_sample(actions[name], value)}")
        elif i and args[i - 1] in actions and not arg.startswith("-") and _is_placeholder(arg):
            out.append(_sample(actions[args[i - 1]], arg))
        else:
            out.append(arg)
    return out


def _sample(action: argparse.Action, placeholder: str) -> str:
    if action.choices:
        return str(list(action.choices)[0])
    if action.type in (None, str):
        return placeholder
    for candidate in ("1", "0.5"):
        try:
            action.type(candidate)
            return candidate
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            continue
    return placeholder


def _parse(parser: argparse.ArgumentParser, args: list[str], partial: bool):
    """(namespace, extras) of ARGS by PARSER; _ParseError with argparse's message."""
    def error(message):
        raise _ParseError(message)
    parser.error = error
    if partial:
        for action in parser._actions:
            action.required = False
        for group in parser._mutually_exclusive_groups:
            group.required = False
        for action in parser._actions:               # positionals too: `paragen-generate ... --x`
            if not action.option_strings and action.nargs is None:
                action.nargs = "?"
    return REAL_PARSE_KNOWN_ARGS(parser, _fill(parser, args))


def _capture(kind: str, target: str, args: list[str], env: dict) -> _Parsed:
    """Run the program's entry point with ARGS until its first argparse call."""
    saved_argv, saved_env = sys.argv, dict(os.environ)
    os.environ.update(env)
    try:
        sys.argv = [target, *args]
        with _first_parse_stops():
            if kind == "script":
                runpy.run_path(os.path.join(ROOT, target), run_name="__main__")
            else:
                module, _, function = target.partition(":")
                getattr(importlib.import_module(module), function or "main")()
    except _Parsed as parsed:
        return parsed
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    raise _ParseError("the program returned before parsing its arguments")


def check_one(command: dict) -> list[str]:
    """What is wrong with one documented command, as lines."""
    where, target, env = command["where"], command["target"], command["env"]
    partial = "..." in command["args"]
    args = [a.strip("[]") if a.startswith("[--") or a.endswith("]") else a for a in command["args"] if a != "..."]
    try:
        parsed = _capture(command["kind"], target, args, env)
        module = target.split(":")[0]
        namespace, extras = _parse(parsed.parser, parsed.args, partial)
    except _ParseError as exc:
        return [f"{where}: {exc}"]
    except SystemExit as exc:
        return [f"{where}: exits {exc.code} before parsing its arguments"]
    problems = []
    if module in BEAM_JOBS:
        problems += _beam_problems(where, [e for e in extras if e != "..."], parsed.parser.format_help())
    elif extras:
        problems.append(f"{where}: unrecognized arguments: {' '.join(extras)}")
    if module == "beam_pipelines.refresh":
        problems += _refresh_problems(where, namespace, env, partial)
    return problems


def _beam_problems(where: str, extras: list[str], job_help: str) -> list[str]:
    """The arguments a Beam job hands on, through the parser the job refuses unknown options with;
    those that are the project's (SLURM, Dask retries, Flink restarts) must be named in JOB_HELP,
    the job's --help (Beam's own are Beam's to document)."""
    from beam_pipelines.options import _beam_parser, qualify_runner, runner_name

    parser = _beam_parser()
    args = qualify_runner(extras)
    try:
        _known, unknown = _parse(parser, args, False)
    except _ParseError as exc:
        return [f"{where}: {exc}"]
    if unknown:
        return [f"{where}: unknown option(s): {' '.join(unknown)}"]
    unnamed = sorted({a.split("=")[0] for a in extras if a.split("=")[0] in _project_beam_options()}
                     - set(re.findall(r"--\w+", job_help)))
    if unnamed:
        return [f"{where}: the job's --help does not name {', '.join(unnamed)}"]
    from apache_beam.runners.runner import create_runner

    runner = runner_name(args)
    try:
        create_runner(runner)
    except ImportError:
        pass                                    # a runner whose Beam extra is not installed here (Dataflow: [gcp])
    except (ValueError, AttributeError) as exc:
        return [f"{where}: --runner {runner}: {str(exc).splitlines()[0]}"]
    return []


def _project_beam_options() -> set[str]:
    """The options of the project's own PipelineOptions classes."""
    from apache_beam.options.pipeline_options import PipelineOptions

    import beam_pipelines.runners  # noqa: F401: registers them
    import beam_pipelines.slurm_settings  # noqa: F401

    names = set()
    for cls in PipelineOptions.__subclasses__():
        if cls.__module__.split(".")[0] in packages():
            parser = argparse.ArgumentParser(add_help=False)
            cls._add_argparse_args(parser)  # noqa: SLF001: the options a class adds, as Beam collects them
            names |= {o for a in parser._actions for o in a.option_strings}
    return names


def _refresh_problems(where: str, namespace, env: dict, partial: bool) -> list[str]:
    """paragen-refresh hands on: after --, the generation job's options (it adds --output and
    --previous); --filter_args, the filter job's (it adds --input and --output); --job_cmd and
    --filter_cmd, a command whose program must exist."""
    job_args = [a for a in namespace.job_args if a != "--"]
    if partial:
        job_args.append("...")
    out = check_one({"where": where + " [after --]", "kind": "module", "target": "beam_pipelines.generate:main",
                     "args": [*job_args, "--output", "OUT"], "env": env})
    if namespace.filter_args:
        out += check_one({"where": where + " [--filter_args]", "kind": "module", "target": "beam_pipelines.filter:main",
                          "args": [*shlex.split(namespace.filter_args), "--input", "IN", "--output", "OUT",
                                   *(["..."] if partial else [])],
                          "env": env})
    for option in ("job_cmd", "filter_cmd"):
        words = split_env(shlex.split(getattr(namespace, option) or ""))[1]
        if words and "/" in words[0] and not os.path.isfile(os.path.join(ROOT, words[0])):
            out.append(f"{where}: --{option} {words[0]}: no such file")
    return out


def main() -> int:
    commands = json.load(sys.stdin)
    problems = []
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        for command in commands:
            problems += check_one(command)
    json.dump(problems, real_stdout)
    return 0


def check_commands(commands: list[Command]) -> list[str]:
    """Problems of COMMANDS (launchers resolved first), each a line naming where it is."""
    problems, resolved = [], []
    with tempfile.TemporaryDirectory() as workdir:
        for command in commands:
            got = resolve_launcher(command, workdir) if command.kind == "launcher" else command
            (problems.append if isinstance(got, str) else resolved.append)(got)
    for command in resolved:
        if command.kind == "module" and ":" not in command.target:
            command.target += ":main"
    done = subprocess.run([sys.executable, "-m", "tests.doc_commands"], cwd=ROOT, capture_output=True, text=True,
                          input=json.dumps([c.as_json() for c in resolved]), timeout=600,
                          env={**os.environ, "PYTHONPATH": ROOT})
    if done.returncode != 0:
        return problems + [f"python -m tests.doc_commands exits {done.returncode}: {done.stderr[-2000:]}"]
    return problems + json.loads(done.stdout)


if __name__ == "__main__":
    sys.exit(main())
