"""Mutation testing of the modules where a bug loses data or money (``make mutation``).

Runs mutmut from scratch on each module of pyproject.toml ``[tool.kale.mutation.tests]`` (the
Kale policy's stages, the planner, the throughput model's fit and peak guard, the rebalancer
and the offset handover, the fleet's budget, the generations, the worker's
commit/checkpoint/restore path and its warm ranks, the registry's comparison and promotion, the
Kale page's auth), one module at a time in its own work directory ``mutants/<module>/``, against
that module's own fast tests (the shared settings are ``[tool.mutmut]``), within a time budget.
It prints per module the mutants killed and surviving and writes
``benchmarks/results/mutation.json``:
``{"score": S, "modules": {"<path>": {"killed": K, "survived": V, "score": S, "commit": C, ...}},
"survivors": {"<path>": [{"mutant", "change", "explained"}]}}``; each module records the commit
it ran at, and ``--modules`` brings a few up to date while the others keep theirs.
``--recheck`` runs only a module's unexplained survivors again, against the tests as they
are now, when its source and its list of tests in pyproject.toml have not changed since its
run: after writing tests for what survived, minutes instead of a whole run (the commit it
records is the recheck's, its tests' commit).

A survivor is *explained* when ``benchmarks/mutation_equivalent.toml`` names its change
(function and mutated line, so the explanation survives a renumbering of the mutants) with
the reason it is equivalent; the report lists every other survivor as unexplained. Mutants
no test reaches ("no tests") count as survivors. List a survivor's diff with
``cd mutants/<module> && ../../.venv/bin/python -m mutmut show NAME``.

This file is also a pytest plugin (``-p benchmarks.mutation`` in ``[tool.mutmut]``): under
mutmut it runs each mutant's tests fastest first, so a mutant dies on its quickest test.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT = ROOT / "benchmarks" / "mutation_equivalent.toml"

# mutmut's exit codes: the tests noticed (failure, internal error, CPU-time limit, killed)
KILLED = {1, 3, 24, -24, 152, 255, 36, -9, -11}
SURVIVED = {0, 5, 33}  # tests passed, or no test reaches the mutant
SUSPICIOUS = 35


# ------------------------------------------------------------------ pytest plugin
def pytest_collection_modifyitems(session, config, items):
    """Under mutmut: run the tests of a mutant fastest first (durations from mutmut's stats
    run), so a killed mutant stops at its quickest failing test (``-x``)."""
    stats = Path("mutmut-stats.json")  # mutmut runs the tests from mutants/
    if not os.environ.get("MUTANT_UNDER_TEST") or not stats.exists():
        return
    try:
        durations = json.loads(stats.read_text()).get("duration_by_test", {})
    except (OSError, ValueError):
        return
    items.sort(key=lambda item: durations.get(item.nodeid, float("inf")))


# ------------------------------------------------------------------ the report
def _functions(path: Path) -> dict[str, str]:
    """Source of every function of a mutated module, by name (``x_f__mutmut_3``, ``xǁCǁm__mutmut_orig``)."""
    src = path.read_text()
    lines = src.splitlines()
    out = {}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "__mutmut_" in node.name:
            out[node.name] = "\n".join(lines[node.lineno - 1:node.end_lineno])
    return out


def _readable(func: str) -> str:
    """``x__carry_over`` -> ``_carry_over``, ``xǁAssignmentǁto_dict`` -> ``Assignment.to_dict``."""
    if func.startswith("xǁ"):
        return ".".join(func[2:].split("ǁ"))
    return func[2:] if func.startswith("x_") else func


def change_of(functions: dict[str, str], mutant: str) -> str:
    """``function: -old line / +new line`` of a mutant (whitespace collapsed)."""
    name = mutant.rsplit(".", 1)[-1]
    func, _, _ = name.rpartition("__mutmut_")
    orig, mutated = functions.get(f"{func}__mutmut_orig"), functions.get(name)
    if orig is None or mutated is None:
        return f"{func}: ?"
    orig = orig.replace(f"{func}__mutmut_orig", func)
    mutated = mutated.replace(name, func)
    diff = [line for line in difflib.unified_diff(orig.splitlines(), mutated.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    return f"{_readable(func)}: " + " / ".join(re.sub(r"\s+", " ", line).strip() for line in diff)


def load_equivalent(path: Path = EQUIVALENT) -> dict[str, str]:
    """``change -> reason`` from the checked-in explanations (see the file's header)."""
    if not path.exists():
        return {}
    doc = tomllib.loads(path.read_text())
    return {entry["change"]: entry["reason"] for entry in doc.get("equivalent", [])}


def tally(mutants: Path, equivalent: dict[str, str]) -> tuple[dict, dict]:
    """Per module counts and survivors (with their change and explanation) from ``*.meta``."""
    modules, survivors = {}, {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        module = str(meta.relative_to(mutants))[: -len(".meta")]
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        functions = _functions(mutants / module)
        killed = sum(1 for c in codes.values() if c in KILLED)
        alive = sorted(k for k, c in codes.items() if c in SURVIVED)
        not_run = sum(1 for c in codes.values() if c is None)
        rows = []
        for name in alive:
            change = change_of(functions, name)
            rows.append({"mutant": name, "change": change, "explained": equivalent.get(change),
                         "no_tests": codes[name] in (5, 33)})
        ran = killed + len(alive)
        modules[module] = {"killed": killed, "survived": len(alive),
                           "explained": sum(1 for r in rows if r["explained"]),
                           "suspicious": sum(1 for c in codes.values() if c == SUSPICIOUS), "not_run": not_run,
                           "score": round(killed / ran, 4) if ran else None}
        survivors[module] = rows
    return modules, survivors


def run_mutmut(workdir: Path, budget_s: float, log: Path, names: list[str] = ()) -> bool:
    """``mutmut run`` (of ``names`` only, when given) in ``workdir``, in its own process group;
    stopped (the whole group) at the budget."""
    with log.open("a" if names else "w") as fh:
        # One math thread per test process: mutmut forks a process per mutant from one that has
        # run torch, and a forked OpenMP pool deadlocks (the worker's tests then time out).
        env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "mutmut", "run", *names], cwd=workdir, stdout=fh, env=env,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=max(budget_s, 1.0))
            return True
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # mutmut ignores SIGTERM; its workers share the group
            proc.wait()
            return False


def workdir(module: str) -> Path:
    """Where one module's mutmut runs: ``mutants/kale_airflow.core.planning/`` (mutmut's own
    ``mutants/`` inside it)."""
    return ROOT / "mutants" / module.removesuffix(".py").replace("/", ".")


def run_tests(module: str) -> list[str] | None:
    """The test selection ``module``'s last run used (its work directory's pyproject.toml)."""
    path = workdir(module) / "pyproject.toml"
    if not path.exists():
        return None
    return tomllib.loads(path.read_text())["tool"]["mutmut"].get("pytest_add_cli_args_test_selection")


def prepare(module: str, tests: list[str], keep: bool) -> Path:
    """A work directory that is the checkout (links to its files) with a pyproject.toml whose
    ``[tool.mutmut]`` mutates ``module`` only and runs ``tests``."""
    wd = workdir(module)
    if not keep:
        shutil.rmtree(wd, ignore_errors=True)
    wd.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        link = wd / entry.name
        if entry.name not in {"pyproject.toml", "mutants", ".git"} and not link.is_symlink():
            link.symlink_to(entry)
    # [tool.mutmut] is the file's last table: lines appended at the end belong to it.
    text = (ROOT / "pyproject.toml").read_text().rstrip("\n") + (
        f"\nonly_mutate = {json.dumps([module])}\npytest_add_cli_args_test_selection = {json.dumps(tests)}\n")
    got = tomllib.loads(text)["tool"]["mutmut"]
    if got.get("only_mutate") != [module] or got.get("pytest_add_cli_args_test_selection") != tests:
        raise SystemExit("pyproject.toml: keep [tool.mutmut] the last table of the file (benchmarks/mutation.py "
                         "adds each module's only_mutate and test selection at its end)")
    (wd / "pyproject.toml").write_text(text)
    return wd


def print_report(doc: dict) -> None:
    print(f"{'module':<42} {'killed':>7} {'survived':>9} {'explained':>10} {'not run':>8} {'score':>6}")
    for name, m in doc["modules"].items():
        score = f"{m['score']:.2f}" if m["score"] is not None else "-"
        print(f"{name:<42} {m['killed']:>7} {m['survived']:>9} {m['explained']:>10} {m['not_run']:>8} {score:>6}")
    run = f"mutmut ran {doc['run_wall_s']:.0f} s" if doc["run_wall_s"] is not None else "no run"
    print(f"mutation score {doc['score']} over {doc['ran']} mutants run; {doc['unexplained']} survivor(s) "
          f"unexplained; {run}, {'finished' if doc['finished'] else 'NOT finished'}; wall {doc['wall_s']:.0f} s")
    for module, rows in doc["survivors"].items():
        for r in rows:
            if not r["explained"]:
                print(f"  UNEXPLAINED {r['mutant']}: {r['change']}")


def module_tests() -> dict[str, list[str]]:
    """``[tool.kale.mutation.tests]`` of pyproject.toml: per mutated module, its tests."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["kale"]["mutation"]["tests"]


def mutated_modules() -> list[str]:
    return list(module_tests())


def unchanged_since(commit: str | None, module: str) -> bool:
    """Whether ``module`` in the work tree is the source its run at ``commit`` mutated."""
    return bool(commit) and subprocess.run(["git", "diff", "--quiet", commit, "--", module], cwd=ROOT).returncode == 0


def head_commit() -> str | None:
    """The short hash of the checked-out commit (None outside a git checkout)."""
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.strip() or None


def merged(previous: dict, modules: dict, survivors: dict, only: list[str]) -> tuple[dict, dict]:
    """The result file's modules and survivors with ``only``'s replaced by this run's: a run of
    a few modules keeps the others' figures from the run that made them (each module says at
    which commit it ran)."""
    keep = {k: v for k, v in previous.get("modules", {}).items() if k not in only}
    kept_survivors = {k: v for k, v in previous.get("survivors", {}).items() if k not in only}
    return ({**keep, **{k: modules[k] for k in only if k in modules}},
            {**kept_survivors, **{k: survivors[k] for k in only if k in survivors}})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=4 * 60 * 60,
                    help="stop after this many seconds in all (modules not reached keep their last figures)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "mutation.json"))
    ap.add_argument("--report-only", action="store_true", help="tally the last runs without running mutmut")
    ap.add_argument("--keep", action="store_true",
                    help="reuse each module's mutants/ (mutmut's cache) instead of starting afresh")
    ap.add_argument("--recheck", action="store_true",
                    help="run only the last run's unexplained surviving mutants again, against the tests as they "
                         "are now (after adding tests for them); refused for a module whose source or test list "
                         "changed since")
    ap.add_argument("--modules", nargs="+", metavar="PATH", default=[],
                    help="mutate only these modules of [tool.kale.mutation.tests] (e.g. kale_airflow/core/planning.py) "
                         "and merge their figures into the result file; the other modules keep theirs")
    args = ap.parse_args()
    tests = module_tests()
    unknown = sorted(set(args.modules) - set(tests))
    if unknown:
        ap.error(f"not in [tool.kale.mutation.tests] of pyproject.toml: {', '.join(unknown)} "
                 f"(one of: {', '.join(tests)})")
    t0 = time.monotonic()
    previous = json.loads(Path(args.json).read_text()) if Path(args.json).exists() else {}
    todo = [m for m in tests if m in args.modules] if args.modules else list(tests)
    modules, survivors, equivalent = {}, {}, load_equivalent()
    finished, run_wall_s = previous.get("finished"), previous.get("run_wall_s")
    if args.report_only:  # each module's last run, at the commit that run recorded
        for module in todo:
            if (workdir(module) / "mutants").exists():
                got, rows = tally(workdir(module) / "mutants", equivalent)
                modules.update(got)
                survivors.update(rows)
                for name in got:
                    modules[name]["commit"] = previous.get("modules", {}).get(name, {}).get("commit")
    else:
        finished = True
        for i, module in enumerate(todo, 1):
            left = args.budget_s - (time.monotonic() - t0)
            if left <= 0:
                finished = False
                break
            print(f"[{i}/{len(todo)}] {module}: mutmut against {len(tests[module])} test selection(s), "
                  f"{left:.0f} s of budget left", flush=True)
            names = []
            if args.recheck:
                last = previous.get("modules", {}).get(module, {})
                if not unchanged_since(last.get("commit"), module) or not (workdir(module) / "mutants").exists():
                    raise SystemExit(f"{module} changed since its last run (or has none): --recheck reruns the "
                                     "survivors of that run only; run the module afresh")
                if run_tests(module) != tests[module]:  # mutmut resets every result when they change
                    raise SystemExit(f"{module}'s tests in pyproject.toml changed since its last run: --recheck "
                                     "cannot carry that run's results over; run the module afresh")
                names = [r["mutant"] for r in previous.get("survivors", {}).get(module, [])
                         if not equivalent.get(r["change"])]  # the explained ones are equivalent
                if not names:
                    continue
            # mutmut copies the code now
            wd, commit = prepare(module, tests[module], args.keep or args.recheck), head_commit()
            done = run_mutmut(wd, left, wd / "mutants-run.log", names)
            got, rows = tally(wd / "mutants", equivalent)
            for name in got:
                got[name]["commit"] = commit
            modules.update(got)
            survivors.update(rows)
            if not done:
                print(f"mutmut stopped at the {args.budget_s:.0f} s budget; mutants not run are reported as such")
                finished = False
                break
        run_wall_s = round(time.monotonic() - t0, 1)
    modules, survivors = merged(previous, modules, survivors, list(modules))
    modules = {name: modules[name] for name in tests if name in modules}  # the configuration's order
    finished = bool(finished) and set(modules) == set(tests) and all(m["not_run"] == 0 for m in modules.values())
    killed = sum(m["killed"] for m in modules.values())
    ran = killed + sum(m["survived"] for m in modules.values())
    unexplained = sum(1 for rows in survivors.values() for r in rows if not r["explained"])
    doc = {"score": round(killed / ran, 4) if ran else None, "ran": ran, "unexplained": unexplained,
           "run_wall_s": run_wall_s, "wall_s": round(time.monotonic() - t0, 1), "finished": finished,
           "modules": modules, "survivors": {name: survivors[name] for name in modules if name in survivors}}
    print_report(doc)
    sys.path.insert(0, str(ROOT))
    from kale_airflow.reporting.results import write_json

    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
