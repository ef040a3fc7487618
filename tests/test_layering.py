"""The import direction of DESIGN.md: storage/ and coordination/ import nothing else of ours
(nor Ray/Spark), jobs/ imports only the public API."""

import ast
import functools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
OURS = {"actors", "storage", "coordination", "jobs"}


def _imports(package):
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, alias.name.split(".")[0], alias.name
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield path, node.module.split(".")[0], node.module


def test_storage_imports_nothing_of_ours_nor_ray():
    """storage/ imports no other raykafka package and no Ray, kazoo or Spark."""
    banned = OURS - {"storage"} | {"ray", "kazoo", "pyspark", "raydp"}
    bad = [(str(p), m) for p, top, m in _imports("storage") if top in banned]
    assert bad == []


def test_coordination_imports_nothing_of_ours_nor_ray():
    """coordination/ imports no other raykafka package and no Ray or Spark."""
    banned = OURS - {"coordination"} | {"ray", "pyspark", "raydp"}
    bad = [(str(p), m) for p, top, m in _imports("coordination") if top in banned]
    assert bad == []


def test_jobs_import_only_the_public_api():
    """jobs/ reaches actors only through its public modules (actors, actors.errors)."""
    public = {"actors", "actors.errors"}
    bad = [(str(p), m) for p, top, m in _imports("jobs")
           if top in {"storage", "coordination"} or (top == "actors" and m not in public)]
    assert bad == []


def _from_module(package, node):
    """The absolute module a ``from X import ...`` node inside ``package`` names."""
    if not node.level:
        return node.module
    parts = package.split(".")
    return ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))


def _resolve(package, node):
    """The absolute module names an ImportFrom/Import node inside ``package`` brings in."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    module = _from_module(package, node)
    return [module] if node.module else [f"{module}.{a.name}" for a in node.names]


def _import_nodes(path):
    """(package, node) for every import statement of the file, those inside functions too."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield package, node


def _actors_imports(side):
    """(path, module) for every import in actors/<side>/, relative ones resolved."""
    for path in sorted((ROOT / "actors" / side).rglob("*.py")):
        for package, node in _import_nodes(path):
            for name in _resolve(package, node):
                yield path, name


def _crossing(side, other):
    return [(str(p.relative_to(ROOT)), m) for p, m in _actors_imports(side)
            if m == f"actors.{other}" or m.startswith(f"actors.{other}.")]


def test_client_never_imports_server():
    """actors/client/ reaches the server side only through actors.protocol, never actors.server."""
    assert _crossing("client", "server") == []
    assert _crossing("client", "tools") == []


def test_server_never_imports_client():
    """actors/server/ never imports actors.client (nor tools); the sides meet in protocol."""
    assert _crossing("server", "client") == []
    assert _crossing("server", "tools") == []


def test_the_layering_check_sees_relative_imports():
    """The checker resolves `from ..server.broker import x` and `from .. import server` inside
    actors/client to actors.server..., so a relative import cannot slip past it."""
    tree = ast.parse("from ..server.broker import Broker\nfrom .. import server\n"
                     "from .metadata import Metadata\n")
    found = [m for node in tree.body for m in _resolve("actors.client", node)]
    assert found == ["actors.server.broker", "actors.server", "actors.client.metadata"]


def test_actors_top_level_is_the_shared_core():
    """actors/ holds only the composition root and what both sides share (the wire codec
    and the Kafka connection both the clients and a follower broker's fetcher use, the hop
    trace both sides write); the rest lives in server/, client/ or tools/."""
    top = sorted(p.name for p in (ROOT / "actors").glob("*.py"))
    assert top == ["__init__.py", "_rayenv.py", "cluster.py", "connection.py", "errors.py",
                   "hoptrace.py", "protocol.py", "raycompat.py", "types.py", "wire.py"]


# -- the whole import graph: no cycles ------------------------------------------------------
def _our_modules():
    """{module name: path} of every module of ours (a package by its own name)."""
    modules = {}
    for package in sorted(OURS):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


@functools.lru_cache(maxsize=None)
def _lazy_exports(path):
    """{name: module} of a package's lazy ``_EXPORTS`` (actors/__init__.py: ``from actors
    import Cluster`` loads actors.cluster), {} for a module without one."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            return {name: where[0] for name, where in ast.literal_eval(node.value).items()}
    return {}


def _owner(name, modules):
    """The module of ours that ``name`` (``pkg.module.attr``) loads, or None: the name itself,
    a package's lazy export, else its longest prefix that is one of our modules."""
    module, _, attr = name.rpartition(".")
    if name not in modules and module in modules and attr in _lazy_exports(modules[module]):
        return _lazy_exports(modules[module])[attr]
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _loads(package, node, modules):
    """Our modules an import node inside ``package`` loads (``from X import a``: X.a when
    that is a module, else X)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        module = _from_module(package, node)
        names = [f"{module}.{alias.name}" for alias in node.names]
    return {_owner(name, modules) for name in names} - {None}


def _import_graph():
    """{module: the modules of ours it imports anywhere in its file}, without self-edges."""
    modules = _our_modules()
    return {module: set().union(*(_loads(package, node, modules)
                                  for package, node in _import_nodes(path))) - {module}
            for module, path in modules.items()}


def _find_cycle(graph):
    """One cycle ``[a, b, ..., a]`` of ``graph`` ({module: imported modules}), or []."""
    state = {}      # module -> "open" while on the depth-first path, "done" after
    path = []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == "open":
                return path[path.index(imported):] + [imported]
            if imported not in state and (cycle := visit(imported)):
                return cycle
        state[module] = "done"
        path.pop()
        return []

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return []


def test_the_graph_sees_imports_in_functions_and_lazy_exports():
    """The graph resolves relative imports, ``from pkg import submodule``, imports inside
    functions and the names actors/__init__ exports lazily, so none hides an edge."""
    modules = _our_modules()
    tree = ast.parse("def f():\n    from ..cluster import Cluster\n"
                     "    from actors import Cluster, Producer\n"
                     "from . import metadata\nimport ray\n")
    found = set().union(*(_loads("actors.client", node, modules) for node in ast.walk(tree)
                          if isinstance(node, (ast.Import, ast.ImportFrom))))
    assert found == {"actors.cluster", "actors.client.producer", "actors.client.metadata"}
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == \
        ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) == []


def test_our_modules_import_each_other_without_cycles():
    """No module of actors/, storage/, coordination/ or jobs/ reaches itself through imports
    (inside functions too): dependencies point one way, as DESIGN.md's layers do."""
    cycle = _find_cycle(_import_graph())
    assert cycle == [], "import cycle: " + " -> ".join(cycle)


def test_client_and_server_never_import_the_composition_root():
    """actors/client/ and actors/server/ never import actors.cluster (it imports them: it
    is the composition root); what they need of it is passed in."""
    bad = sorted((module, "actors.cluster") for module, imported in _import_graph().items()
                 if module.startswith(("actors.client", "actors.server"))
                 and "actors.cluster" in imported)
    assert bad == []


def _imported_by_name(path):
    """Modules ``path`` loads through ``importlib.import_module("x")`` / ``__import__("x")``
    with a literal name (an import that no import statement shows)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                yield node.args[0].value


def test_actors_never_import_jobs():
    """actors/ (the CLI and the demos included) never imports jobs/, the layer above it: no
    import statement anywhere in actors/ (relative ones resolved, those inside functions
    too) nor an import_module/__import__ by name reaches jobs. The CLI runs the main demo,
    a job, as a child process: ``python -m jobs.examples.etl``."""
    def is_jobs(module):
        return module == "jobs" or module.startswith("jobs.")
    bad = []
    for path in sorted((ROOT / "actors").rglob("*.py")):
        names = [n for package, node in _import_nodes(path) for n in _resolve(package, node)]
        names += list(_imported_by_name(path))
        bad += [(str(path.relative_to(ROOT)), n) for n in names if is_jobs(n)]
    assert bad == []
