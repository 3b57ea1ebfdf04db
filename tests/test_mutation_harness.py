"""benchmarks/mutation.py's run of a few modules: which mutants it names, and how their
figures join the result file's."""

import fnmatch
import subprocess
import sys
from pathlib import Path

from benchmarks.mutation import merged, mutant_glob, mutated_modules

ROOT = Path(__file__).resolve().parents[1]


def test_a_modules_pattern_names_its_mutants_and_no_other_modules():
    pattern = mutant_glob("kale_airflow/core/planning.py")
    assert fnmatch.fnmatch("kale_airflow.core.planning.x_first_step__mutmut_3", pattern)
    assert fnmatch.fnmatch("kale_airflow.core.planning.xǁPricesǁ__init____mutmut_1", pattern)
    assert not fnmatch.fnmatch("kale_airflow.core.policies.kale.xǁKalePolicyǁplan__mutmut_1", pattern)
    assert not fnmatch.fnmatch("kale_airflow.core.planning_extra.x_f__mutmut_1", pattern)


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
    assert "not in [tool.mutmut] only_mutate of pyproject.toml: kale_airflow/nope.py" in proc.stderr
    assert mutated_modules()[0] in proc.stderr
