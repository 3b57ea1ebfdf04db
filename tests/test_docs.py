"""The documentation cannot drift from the code: the generated parts (settings reference,
chart values table, mutation table) match what the code generates, the README's
``kale.yaml`` is a valid deployment, every relative link resolves, every environment
variable the package reads is documented, and the README stays short and free of
development-process words."""

import ast
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from kale_airflow.config import environment
from kale_airflow.config.deployment import parse_deployment
from kale_airflow.reporting import docs

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKDOWN = [README, ROOT / "charts" / "kale-airflow" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
PROCESS_WORDS = [
    r"\brounds?\b(?![- ](robin|trip))", r"\bissues? \d+", r"\bthis task\b", r"\bdisclosure\b", r"\bthis session\b",
    r"\bcandidates? (was|were) chosen after\b", r"\bissue \d+'s\b",
]


def _prose(path: Path) -> str:
    """The Markdown without its fenced code blocks (their ``#`` lines are no headings, their
    brackets no links)."""
    return FENCE.sub("", path.read_text())


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", _prose(path), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def broken_links(paths) -> list[str]:
    """``file: target`` for every relative link whose file (or heading anchor) does not exist
    (links inside code are not links)."""
    out = []
    for path in paths:
        for target in LINK.findall(re.sub(r"`[^`\n]*`", "", _prose(path))):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                out.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                out.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    return out


def test_generated_docs_are_up_to_date():
    stale = docs.stale()
    assert not stale, (f"generated documentation is stale: {', '.join(stale)}; regenerate it with "
                       f"`{docs.COMMAND}` (from the repository root) and commit the result")


def test_the_staleness_check_can_fail(tmp_path):
    for rel, _, _ in docs.GENERATED:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    changed = tmp_path / "docs" / "configuration.md"
    changed.write_text(changed.read_text().replace("| `slo_s` |", "| `slo_seconds` |", 1))
    assert docs.stale(tmp_path) == ["docs/configuration.md"]
    assert docs.stale(tmp_path, write=True) == ["docs/configuration.md"] and docs.stale(tmp_path) == []


def test_a_field_without_a_description_is_refused():
    from pydantic import BaseModel

    class Undocumented(BaseModel):
        knob: int = 1

    with pytest.raises(docs.DocsError, match="Undocumented.knob has no description"):
        docs.model_rows(Undocumented)


def test_the_readme_kale_yaml_is_a_valid_deployment():
    blocks = re.findall(r"^```yaml\n(.*?)^```", README.read_text(), re.S | re.M)
    assert blocks, "README.md has no ```yaml block (the minimal kale.yaml)"
    dep = parse_deployment(yaml.safe_load(blocks[0]), "README.md's kale.yaml")
    assert dep.worker_backend == "kubernetes"


def test_every_relative_link_resolves():
    assert broken_links(MARKDOWN) == []


def test_the_link_check_catches_a_missing_file_and_heading(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md) [bad](#nowhere)\n```\n[code](not-a-link.md)\n```\n")
    assert broken_links([page]) == ["page.md: missing.md (no such file)", "page.md: #nowhere (no such heading)"]


def test_the_readme_is_short_and_says_nothing_about_how_it_was_made():
    text = README.read_text()
    assert len(text.splitlines()) <= 220
    found = [m.group(0) for w in PROCESS_WORDS for m in re.finditer(w, text, re.I)]
    assert found == []
    assert "<!-- END GENERATED engine-summary -->" in text.splitlines()  # the results come from engine.json


def _environment_reads(path: Path) -> set[str]:
    """``KALE_*`` names read from the environment in ``path``: literal arguments of
    ``os.environ.get``/``os.getenv``/``os.environ[...]``, and constants named ``*_ENV``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        literals = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and (
                node.func.attr == "getenv" or node.func.attr == "get" and "environ" in ast.unparse(node.func.value)):
            literals = [node.args[0]]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
            literals = [node.slice]
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            pairs = zip(target.elts, value.elts) if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) \
                else [(target, value)]
            literals = [v for t, v in pairs if isinstance(t, ast.Name) and t.id.endswith("_ENV")]
        names |= {n.value for n in literals if isinstance(n, ast.Constant) and isinstance(n.value, str)
                  and n.value.startswith("KALE_")}
    return names


def test_every_environment_variable_the_package_reads_is_documented():
    read = {name for path in (ROOT / "kale_airflow").rglob("*.py") for name in _environment_reads(path)}
    documented = set(docs.docstring_bullets(environment.__doc__))
    assert read, "found no environment reads: the scan is broken"
    assert read - documented == set(), ("document these in kale_airflow/config/environment.py's docstring "
                                        f"(``NAME``: meaning), then run {docs.COMMAND}")


def test_the_environment_scan_finds_every_kind_of_read(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text('import os\nA_ENV = "KALE_A"\nB_ENV, C = "KALE_B", "KALE_C"\nos.environ.get("KALE_D")\n'
                   'os.getenv("KALE_E")\nos.environ["KALE_F"]\nprint("KALE_G")\n')
    assert _environment_reads(mod) == {"KALE_A", "KALE_B", "KALE_D", "KALE_E", "KALE_F"}
