"""No import cycle among elasticbench's modules (elasticbench/ and kernels/, installed as
elasticbench.kernels). Every import counts, those inside functions too: a lazy import does
not remove a cycle, it only postpones it to the call that needs it. So does a module's name
written as a string: a string constant anywhere in a module's source that is exactly the
dotted name of one of the project's modules (importlib.import_module("elasticbench.x"), a
tuple of modules to import) counts as an import of that module. The bare "elasticbench" is
the command's, the distribution's and a directory's name too, so it alone does not count.

Also here: no module imports a layer above its own (docs/architecture.md), and no two
modules share a file name."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"elasticbench": ROOT / "elasticbench", "elasticbench.kernels": ROOT / "kernels"}


def modules() -> dict[str, Path]:
    """Module name -> file, for every Python file of the two packages."""
    out: dict[str, Path] = {}
    for package, directory in PACKAGES.items():
        for path in directory.rglob("*.py"):
            parts = [p for p in path.relative_to(directory).with_suffix("").parts
                     if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def imported(module: str, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    """The modules of `known` that an import statement in `module` names: `from p import x`
    names the submodule p.x where there is one, else p itself."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module if known[module].name == "__init__.py" else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                 for alias in node.names]
    out = []
    for name in names:
        while name and name not in known:  # an attribute of a module, or a module outside
            name = name.rpartition(".")[0]
        if name and name != module:
            out.append(name)
    return out


def named(module: str, node: ast.Constant, known: dict[str, Path]) -> list[str]:
    """The module of `known` that a string constant in `module` names, written out in full
    (a module imported by name at run time), if any; a dotted name only (see the top)."""
    value = node.value
    return ([value] if isinstance(value, str) and "." in value and value in known
            and value != module else [])


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {m: {dep for node in ast.walk(ast.parse(path.read_text()))
                for dep in (imported(m, node, known)
                            if isinstance(node, (ast.Import, ast.ImportFrom))
                            else named(m, node, known) if isinstance(node, ast.Constant)
                            else [])}
            for m, path in known.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep):], dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_imports_itself_through_others() -> None:
    graph = import_graph()
    assert "elasticbench.harness.registry" in graph and "elasticbench.kernels.triton.launch" in graph
    found = cycle(graph)
    assert found is None, "import cycle: " + " -> ".join(found or [])


def test_a_module_named_in_a_string_is_an_import() -> None:
    known = modules()
    source = ('import importlib\n'
              'BUILTIN = ("elasticbench.harness.registry", "elasticbench.nowhere", "elasticbench")\n'
              'importlib.import_module("elasticbench.devices")\n'
              '"""elasticbench.harness.passes, in a sentence, is no import."""\n')
    deps = {dep for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)
            for dep in named("elasticbench.harness.backends", node, known)}
    assert deps == {"elasticbench.harness.registry", "elasticbench.devices"}


def test_the_check_finds_a_cycle() -> None:
    graph = import_graph()
    graph["elasticbench.devices"] = graph["elasticbench.devices"] | {"elasticbench.harness.registry"}
    found = cycle(graph)
    assert found is not None and found[0] == found[-1] and "elasticbench.devices" in found


def readme_layers() -> dict[str, int]:
    """Top-level package or module of elasticbench -> its layer in the picture of
    docs/architecture.md (section Layers: a number starts a layer, a line without one
    continues it)."""
    text = (ROOT / "docs" / "architecture.md").read_text().split("## Layers", 1)[1]
    lines = text.split("```", 2)[1].strip("\n").splitlines()
    cut = lines[0].index("what they are")
    out: dict[str, int] = {}
    layer = 0
    for line in lines[1:]:
        head, names = line[:cut].split(maxsplit=1) if line[:7].strip() else ("", line[:cut])
        layer = int(head) if head else layer
        out.update({name: layer for name in names.split()})
    return out


def top(module: str) -> str:
    """The layer picture's name for a module: the package or module right under elasticbench
    (the library's) or under elasticbench.harness (the harness's); everything in kernels/ is
    `kernels` (the kernels the library runs)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "elasticbench"
    if parts[1] == "harness":
        return parts[2] if len(parts) > 2 else "harness"
    return parts[1]


def upward(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Every import of a module in a layer above the importer's, as 'importer -> imported'."""
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                  if layers[top(d)] > layers[top(m)])


def test_no_module_imports_a_layer_above_its_own() -> None:
    layers = readme_layers()
    graph = import_graph()
    unplaced = sorted({top(m) for m in graph} - set(layers))
    assert not unplaced, f"place these in docs/architecture.md's layer picture: {unplaced}"
    found = upward(graph, layers)
    assert not found, "imports of a layer above: " + "; ".join(found)


def test_the_check_finds_an_upward_import() -> None:
    graph = import_graph()
    graph["elasticbench.harness.records"] = graph["elasticbench.harness.records"] | {"elasticbench.harness.kinds"}
    assert upward(graph, readme_layers()) == ["elasticbench.harness.records -> elasticbench.harness.kinds"]


# Python's own file names (a package's __init__, a package's __main__) are the only names
# two modules may share: a name says what its module holds, so a reader, a traceback or a
# search that shows only the file's name points at one module. The scripts and examples
# count too (the tests have pytest's own rule).
SHARED_BY_PROTOCOL = {"__init__", "__main__"}
NAMED = (ROOT / "elasticbench", ROOT / "kernels", ROOT / "scripts", ROOT / "examples")


def same_names(paths: list[Path]) -> dict[str, list[str]]:
    """File names (without .py) that more than one of paths has, with those paths."""
    by_name: dict[str, list[str]] = {}
    for path in paths:
        if path.stem not in SHARED_BY_PROTOCOL:
            by_name.setdefault(path.stem, []).append(path.relative_to(ROOT).as_posix())
    return {name: sorted(ps) for name, ps in by_name.items() if len(ps) > 1}


def test_no_two_modules_have_one_name() -> None:
    clashes = same_names([p for d in NAMED for p in d.rglob("*.py")])
    assert not clashes, "rename so that each says what it holds: " + "; ".join(
        f"{name}: {', '.join(ps)}" for name, ps in sorted(clashes.items()))


def test_the_name_check_finds_a_clash() -> None:
    paths = [p for d in NAMED for p in d.rglob("*.py")]
    planted = ROOT / "elasticbench" / "harness" / "bench" / "flash.py"
    assert same_names([*paths, planted]) == {
        "flash": ["elasticbench/attention/flash.py", "elasticbench/harness/bench/flash.py"]}
