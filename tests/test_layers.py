"""The project's packages form layers: each imports only the layers below it, so there is no
import cycle between top-level packages (docs/architecture.md draws them). Inside ``models``, the
subpackages ``nmt``, ``bitext`` and ``sentence`` never import one another, and no module of the
project imports itself back through others (no file-level cycle)."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# package -> the project packages it may import (besides itself)
ALLOWED = {
    "common": set(),
    "models": {"common"},
    "paracorpus": {"common", "models"},
    "filtering": {"common", "models", "paracorpus"},
    "embeddings": {"common", "models", "paracorpus"},
    "transforms": {"common", "models", "paracorpus", "filtering"},
    "beam_pipelines": {"common", "models", "paracorpus", "filtering", "transforms"},
}


def imports_of(package: str) -> dict[str, set[str]]:
    """{project package imported: {"file:line", ...}} for every import in PACKAGE's files,
    function-level imports included."""
    found: dict[str, set[str]] = {}
    folder = os.path.join(ROOT, package)
    for dirpath, _, names in os.walk(folder):
        for name in names:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            tree = ast.parse(open(path, encoding="utf-8").read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top in ALLOWED and top != package:
                        found.setdefault(top, set()).add(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    return found


def test_every_package_imports_only_the_layers_below_it():
    wrong = {f"{package} -> {other}": sorted(where)
             for package in ALLOWED for other, where in imports_of(package).items()
             if other not in ALLOWED[package]}
    assert not wrong, wrong


def test_the_layers_have_no_cycle():
    # the allowed graph itself is acyclic (a topological order exists), so the check above rules out
    # every import cycle between packages
    order, left = [], dict(ALLOWED)
    while left:
        ready = [p for p, deps in left.items() if deps <= set(order)]
        assert ready, f"cycle among {sorted(left)}"
        order += sorted(ready)
        for p in ready:
            del left[p]
    assert order[0] == "common" and order[-1] == "beam_pipelines"


def test_every_top_level_package_is_in_a_layer():
    packages = {d for d in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, d, "__init__.py"))}
    assert packages == set(ALLOWED), packages ^ set(ALLOWED)


MODEL_PARTS = {"nmt", "bitext", "sentence"}       # models.<part>: none imports another


def _module_imports() -> dict[str, set[str]]:
    """{module: project modules it imports} for every module of the project, function-level
    imports included; 'from a.b import c' counts as importing a.b.c when that is a module."""
    modules = {}
    for package in ALLOWED:
        for dirpath, _, names in os.walk(os.path.join(ROOT, package)):
            for name in names:
                if name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, name), ROOT)[:-3].replace(os.sep, ".")
                    modules[rel.removesuffix(".__init__")] = os.path.join(dirpath, name)
    graph = {}
    for module, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names}
        graph[module] = deps - {module}
    return graph


def test_model_subpackages_do_not_import_one_another():
    wrong = sorted(f"{m} -> {d}" for m, deps in _module_imports().items() for d in deps
                   if m.split(".")[:1] == ["models"] and len(m.split(".")) > 2 and len(d.split(".")) > 2
                   and d.startswith("models.") and m.split(".")[1] in MODEL_PARTS
                   and d.split(".")[1] in MODEL_PARTS and m.split(".")[1] != d.split(".")[1])
    assert not wrong, wrong


def test_no_module_imports_itself_back():
    graph = _module_imports()
    state: dict[str, int] = {}
    cycles = []

    def visit(module, stack):
        state[module] = 1
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[module] = 2
    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


# models.nmt.<part> -> the parts it may import: the map in models/nmt/__init__.py, lowest first
NMT_LAYERS = {
    "model_files": set(),
    "engine": set(),
    "devices": set(),
    "decoding": {"engine", "devices"},
    "engines": {"decoding", "model_files", "engine", "devices"},
}
NMT_COMMANDS = {"train", "importing", "translate"}        # may import every part


def test_nmt_parts_import_only_the_parts_below_them():
    parts = set(NMT_LAYERS) | NMT_COMMANDS
    wrong = []
    for module, deps in _module_imports().items():
        names = module.split(".")
        if names[:2] != ["models", "nmt"] or len(names) < 3:
            continue
        assert names[2] in parts, f"{module}: a part of models/nmt that the map does not name"
        allowed = parts if names[2] in NMT_COMMANDS else NMT_LAYERS[names[2]] | {names[2]}
        wrong += [f"{module} -> {d}" for d in sorted(deps) if d.split(".")[:2] == ["models", "nmt"]
                  and len(d.split(".")) > 2 and d.split(".")[2] not in allowed]
    assert not wrong, wrong


MAX_MODEL_MODULE_LINES = 600      # a module a reader holds at once (models/bitext/divergence.py was 1,089)


def _model_modules():
    for dirpath, _, names in os.walk(os.path.join(ROOT, "models")):
        for name in sorted(names):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def test_every_module_in_models_says_what_it_holds_and_is_short():
    problems = []
    for path in _model_modules():
        source = open(path, encoding="utf-8").read()
        doc = ast.get_docstring(ast.parse(source)) or ""
        if len(doc) <= 80:                             # subpackages' __init__.py included
            problems.append(f"{os.path.relpath(path, ROOT)}: a docstring of {len(doc)} characters")
        if source.count("\n") > MAX_MODEL_MODULE_LINES:
            problems.append(f"{os.path.relpath(path, ROOT)}: {source.count(chr(10))} lines")
    assert not problems, problems
