"""The core layer stays pure: no Airflow, Kubernetes, MLflow, NeuralProphet or network imports."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import kale_airflow

CORE = Path(kale_airflow.__file__).parent / "core"
FORBIDDEN = {"airflow", "kubernetes", "kubernetes_asyncio", "mlflow", "neuralprophet", "torch", "requests", "httpx",
             "urllib3", "confluent_kafka", "socket", "http", "sqlite3"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_sources_import_nothing_forbidden():
    offenders = {str(p.relative_to(CORE)): sorted(imported_roots(p) & FORBIDDEN) for p in CORE.rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


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


def test_the_ast_check_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from airflow.sdk import dag\nimport mlflow.pyfunc\n")
    assert imported_roots(bad) & FORBIDDEN == {"airflow", "mlflow"}
