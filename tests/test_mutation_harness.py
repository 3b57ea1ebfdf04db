"""benchmarks/mutation.py: each module's own work directory and tests, and how a run of a few
modules joins the result file's figures."""

import subprocess
import sys
from pathlib import Path

from benchmarks import mutation
from benchmarks.mutation import merged, module_tests, mutated_modules

ROOT = Path(__file__).resolve().parents[1]


def test_a_modules_work_directory_mutates_it_alone_against_its_own_tests(tmp_path, monkeypatch):
    import tomllib

    monkeypatch.setattr(mutation, "ROOT", ROOT)
    monkeypatch.setattr(mutation, "workdir", lambda module: tmp_path / module.replace("/", "."))
    tests = module_tests()["kale_airflow/core/planning.py"]
    wd = mutation.prepare("kale_airflow/core/planning.py", tests, keep=False)
    config = tomllib.loads((wd / "pyproject.toml").read_text())
    assert config["tool"]["mutmut"]["only_mutate"] == ["kale_airflow/core/planning.py"]
    assert config["tool"]["mutmut"]["pytest_add_cli_args_test_selection"] == tests == ["tests/core/test_planning.py"]
    # The shared settings and the rest of the file stay as they are.
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert {k: v for k, v in config["tool"]["mutmut"].items() if k not in ("only_mutate",
            "pytest_add_cli_args_test_selection")} == root["tool"]["mutmut"]
    assert config["tool"]["pytest"] == root["tool"]["pytest"]
    # Everything else is the checkout itself.
    assert (wd / "kale_airflow").resolve() == ROOT / "kale_airflow"
    assert (wd / "tests" / "core" / "test_planning.py").exists()
    assert not (wd / "mutants").exists() and not (wd / ".git").exists()
    # Prepared again (--keep), the links are reused.
    assert mutation.prepare("kale_airflow/core/planning.py", tests, keep=True) == wd


def test_a_recheck_knows_the_tests_of_the_run_it_would_continue(tmp_path, monkeypatch):
    """Bug: a recheck after a module's test list changed ran only the old survivors, while mutmut
    had reset every other result for the new list: 883 mutants reported "not run"."""
    monkeypatch.setattr(mutation, "ROOT", ROOT)
    monkeypatch.setattr(mutation, "workdir", lambda module: tmp_path / module.replace("/", "."))
    module = "kale_airflow/core/planning.py"
    assert mutation.run_tests(module) is None  # never run: nothing to continue
    mutation.prepare(module, ["tests/core/test_planning.py"], keep=False)
    assert mutation.run_tests(module) == ["tests/core/test_planning.py"]
    mutation.prepare(module, ["tests/core/test_planning.py", "tests/core/test_slices.py"], keep=True)
    assert mutation.run_tests(module) == ["tests/core/test_planning.py", "tests/core/test_slices.py"]


def test_every_module_has_tests_that_exist():
    for module, tests in module_tests().items():
        assert (ROOT / module).is_file(), module
        assert tests, module
        for test in tests:
            assert (ROOT / test.split("::")[0]).is_file(), test


def test_a_run_of_some_modules_replaces_theirs_and_keeps_the_others():
    previous = {"modules": {"a.py": {"killed": 1, "commit": "old"}, "b.py": {"killed": 2, "commit": "old"}},
                "survivors": {"a.py": [{"mutant": "a1"}], "b.py": [{"mutant": "b1"}]}}
    modules = {"a.py": {"killed": 5, "commit": "new"}, "b.py": {"killed": 0, "not_run": 9}}
    survivors = {"a.py": [], "b.py": []}
    got_modules, got_survivors = merged(previous, modules, survivors, ["a.py"])
    assert got_modules == {"a.py": {"killed": 5, "commit": "new"}, "b.py": {"killed": 2, "commit": "old"}}
    assert got_survivors == {"a.py": [], "b.py": [{"mutant": "b1"}]}


def test_a_module_that_is_not_mutated_is_refused_with_the_ones_that_are():
    proc = subprocess.run([sys.executable, "benchmarks/mutation.py", "--modules", "kale_airflow/nope.py"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "not in [tool.kale.mutation.tests] of pyproject.toml: kale_airflow/nope.py" in proc.stderr
    assert mutated_modules()[0] in proc.stderr
