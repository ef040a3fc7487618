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
