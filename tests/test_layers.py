"""The layers stay as docs/airflow.md's "Architecture" section draws them.

- ``core`` is pure: no Airflow, Kubernetes, MLflow, NeuralProphet, torch or network
  imports, and nothing of ours outside ``core``;
- every import of ours points down the floors (``config`` < adapters < ``runtime`` <
  managers < Airflow glue < ``cli``), lazy imports inside functions included, and the
  packages' import graph has no cycle;
- nothing imports ``cli``; no loose module at the top of ``kale_airflow/``.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kale_airflow

PACKAGE = Path(kale_airflow.__file__).parent
CORE = PACKAGE / "core"
FORBIDDEN = {"airflow", "kubernetes", "kubernetes_asyncio", "mlflow", "neuralprophet", "torch", "requests", "httpx",
             "urllib3", "confluent_kafka", "socket", "http", "sqlite3", "sqlalchemy"}
# The floors, lowest first. A module may import its own package and any lower floor.
FLOORS = {
    "core": 0,
    "config": 1,
    "store": 2, "stream": 2, "metrics": 2, "forecasting": 2, "registry": 2, "reporting": 2,  # adapters
    "runtime": 3,
    "control": 4, "pipelines": 4,                                                              # managers
    "operators": 5, "sensors": 5, "triggers": 5, "ui": 5,                                      # Airflow glue
    "cli": 6,
}
ADAPTERS = {p for p, f in FLOORS.items() if f == 2}
TOP_LEVEL_ALLOWED = {"__init__.py", "get_provider_info.py"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def our_imports(path: Path) -> set[str]:
    """``kale_airflow`` modules imported anywhere in the file (lazy imports in functions included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("kale_airflow.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kale_airflow."):
            out.add(node.module)
    return out


def package_of(module: str) -> str:
    return module.split(".")[1]


def sources():
    return [p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE]


def upward_imports(files) -> dict[str, list[str]]:
    """{file: [imports that point up a floor, or into an adapter from another adapter's peer rules]}."""
    bad = {}
    for path in files:
        own = path.relative_to(PACKAGE).parts[0]
        wrong = sorted(m for m in our_imports(path)
                       if package_of(m) != own and FLOORS[package_of(m)] > FLOORS[own])
        if own in ADAPTERS:  # adapters never reach managers or glue, whatever their floor numbers say
            wrong += sorted(m for m in our_imports(path) if FLOORS[package_of(m)] > 2)
        if wrong:
            bad[str(path.relative_to(PACKAGE))] = sorted(set(wrong))
    return bad


def package_cycles(files) -> list[tuple[str, str]]:
    edges = {(path.relative_to(PACKAGE).parts[0], package_of(m)) for path in files for m in our_imports(path)}
    edges = {(a, b) for a, b in edges if a != b}
    return sorted((a, b) for a, b in edges if (b, a) in edges)


def test_every_package_has_a_floor():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(FLOORS)


def test_no_loose_module_at_the_top():
    assert {p.name for p in PACKAGE.glob("*.py")} == TOP_LEVEL_ALLOWED


def test_core_sources_import_nothing_forbidden():
    offenders = {str(p.relative_to(CORE)): sorted(imported_roots(p) & FORBIDDEN) for p in CORE.rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_imports_point_down_the_floors():
    assert upward_imports(sources()) == {}


def test_packages_import_each_other_in_one_direction_only():
    assert package_cycles(sources()) == []


def test_nothing_imports_the_cli():
    offenders = {str(p.relative_to(PACKAGE)) for p in sources() if p.relative_to(PACKAGE).parts[0] != "cli"
                 and any(package_of(m) == "cli" for m in our_imports(p))}
    assert offenders == set()


def test_importing_every_core_module_loads_no_framework():
    modules = [
        "kale_airflow.core." + ".".join(p.relative_to(CORE).with_suffix("").parts)
        for p in CORE.rglob("*.py") if p.name != "__init__.py"
    ]
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert loaded & (FORBIDDEN - {"socket", "http", "sqlite3"}) == set()


# The checks themselves must be able to fail.
def test_the_ast_check_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from airflow.sdk import dag\nimport mlflow.pyfunc\n")
    assert imported_roots(bad) & FORBIDDEN == {"airflow", "mlflow"}


@pytest.mark.parametrize("package, source, flagged", [
    ("core", "def f():\n    from kale_airflow.config import load_config\n", True),        # lazy upward import
    ("stream", "from kale_airflow.control.generations import X\n", True),                      # adapter -> manager
    ("runtime", "from kale_airflow.operators.worker_pod import X\n", True),              # runtime -> glue
    ("operators", "from kale_airflow.control.generations import Generations\n", False),  # glue -> manager
], ids=["lazy-core", "adapter-control", "runtime-glue", "glue-down"])
def test_the_floor_check_catches_an_upward_import(tmp_path, monkeypatch, package, source, flagged):
    fake = tmp_path / "kale_airflow"
    (fake / package).mkdir(parents=True)
    (fake / package / "mod.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert bool(upward_imports([fake / package / "mod.py"])) is flagged


def test_the_cycle_check_catches_two_packages_importing_each_other(tmp_path, monkeypatch):
    fake = tmp_path / "kale_airflow"
    for pkg, target in (("control", "runtime"), ("runtime", "control")):
        (fake / pkg).mkdir(parents=True)
        (fake / pkg / "m.py").write_text(f"from kale_airflow.{target}.m import x\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert package_cycles(list(fake.rglob("*.py"))) == [("control", "runtime"), ("runtime", "control")]


def long_functions(files, limit: int = 60) -> list[str]:
    out = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit:
                out.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    return sorted(out)


def test_no_function_is_longer_than_60_lines():
    assert long_functions(PACKAGE.rglob("*.py")) == []


def test_the_length_check_catches_a_long_function(tmp_path, monkeypatch):
    fake = tmp_path / "kale_airflow"
    fake.mkdir()
    (fake / "m.py").write_text("def f():\n" + "    x = 1\n" * 60)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert long_functions([fake / "m.py"]) == ["m.py:f"]
