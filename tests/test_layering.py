"""The import direction of DESIGN.md: storage/ and coordination/ import nothing else of ours
(nor Ray/Spark), jobs/ imports only the public API."""

import ast
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


def _resolve(package, node):
    """The absolute module names an ImportFrom/Import node inside ``package`` brings in."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not node.level:
        return [node.module]
    parts = package.split(".")
    module = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
    return [module] if node.module else [f"{module}.{a.name}" for a in node.names]


def _actors_imports(side):
    """(path, module) for every import in actors/<side>/, relative ones resolved."""
    for path in sorted((ROOT / "actors" / side).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
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
    """actors/ holds only the composition root and what both sides share; the rest lives
    in server/, client/ or tools/."""
    top = sorted(p.name for p in (ROOT / "actors").glob("*.py"))
    assert top == ["__init__.py", "_rayenv.py", "cluster.py", "errors.py", "protocol.py",
                   "raycompat.py", "types.py"]
