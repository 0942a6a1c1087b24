"""The project's packages form layers: each imports only the layers below it, so there is no
import cycle between top-level packages (docs/architecture.md draws them)."""
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
