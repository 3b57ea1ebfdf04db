"""The two images' Dockerfiles (docker/): hadolint finds nothing, the base images are pinned
by tag (never latest), the worker image runs as the pods' non-root uid with the worker
module as entrypoint, and the versions, extras and paths agree with the package, the chart
and the pods. The install command itself runs in tests/test_install.py."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
WORKER, AIRFLOW = DOCKER / "worker.Dockerfile", DOCKER / "airflow.Dockerfile"
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(l for l in path.read_text().splitlines() if not l.lstrip().startswith("#")))
    return [(l.split(None, 1)[0].upper(), l.split(None, 1)[1] if " " in l.strip() else "")
            for l in text.splitlines() if l.strip()]


def args(path: Path) -> dict[str, str]:
    return dict(a.split("=", 1) for i, a in instructions(path) if i == "ARG" and "=" in a)


def base(path: Path) -> tuple[str, str]:
    (image,) = [a.split()[0] for i, a in instructions(path) if i == "FROM"]
    repo, _, tag = image.rpartition(":")
    return repo, tag


def extras_declared() -> set[str]:
    section = PYPROJECT.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([a-z][a-z0-9_-]*) = \[", section, re.M))


def package_version() -> str:
    return re.search(r'^version = "([^"]+)"', PYPROJECT, re.M).group(1)


def requirement(name: str) -> Requirement:
    return next(Requirement(r) for r in re.findall(r'"([^"]+)"', PYPROJECT)
                if re.match(rf"{re.escape(name)}\s*[<>=!~]", r))


@pytest.mark.parametrize("path", [WORKER, AIRFLOW], ids=["worker", "airflow"])
def test_hadolint_finds_nothing(path):
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    done = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", [WORKER, AIRFLOW], ids=["worker", "airflow"])
def test_base_images_are_pinned_by_tag_and_the_package_by_version(path):
    repo, tag = base(path)
    assert repo and tag and tag != "latest" and "@" not in repo and "$" not in tag
    assert "latest" not in path.read_text().lower()
    a = args(path)
    assert a["KALE_VERSION"] == package_version()
    assert set(a["KALE_EXTRAS"].split(",")) <= extras_declared()
    copies = [x for i, x in instructions(path) if i == "COPY"]
    assert any("dist/kale_airflow-${KALE_VERSION}-py3-none-any.whl" in c for c in copies)
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore and "!dist/kale_airflow-*-py3-none-any.whl" in ignore  # the build context is small


def test_the_worker_image_has_a_cuda_torch_in_range_and_runs_as_the_pods_user():
    from kale_airflow.config import KubernetesWorkerConfig
    from kale_airflow.runtime.backends import WorkerSpec

    repo, tag = base(WORKER)
    assert repo == "pytorch/pytorch" and "-cuda" in tag and tag.endswith("-runtime")
    torch = Version(tag.split("-")[0])
    assert requirement("torch").specifier.contains(torch)  # the worker extra accepts the base's torch
    assert set(args(WORKER)["KALE_EXTRAS"].split(",")) == {"worker", "kafka", "postgres"}
    uid = KubernetesWorkerConfig().run_as_user
    users = [a for i, a in instructions(WORKER) if i == "USER"]
    assert users and users[-1] == f"{uid}:{uid}"  # numeric: runAsNonRoot can verify it
    assert "--uid 1000" in WORKER.read_text() and uid == 1000
    (entry,) = [a for i, a in instructions(WORKER) if i == "ENTRYPOINT"]
    module = WorkerSpec(stream_url="kafka://k:9092/t", checkpoint_dir="/c").command("g", 0, 1, {})[:3]
    assert yaml.safe_load(entry) == module == ["python", "-m", "kale_airflow.runtime.worker"]
    env = " ".join(a for i, a in instructions(WORKER) if i == "ENV")
    assert "HOME=/tmp" in env  # the pod's root filesystem is read-only; /tmp is its emptyDir


def test_the_airflow_image_pins_the_airflow_the_provider_and_the_chart_name():
    repo, tag = base(AIRFLOW)
    assert repo == "apache/airflow"
    version = tag.split("-")[0]
    assert requirement("apache-airflow").specifier.contains(version) and Version(version) >= Version("3.3")
    values = yaml.safe_load((ROOT / "charts" / "kale-airflow" / "values.yaml").read_text())
    assert values["airflow"]["version"] == version  # the airflowVersion NOTES print
    assert set(args(AIRFLOW)["KALE_EXTRAS"].split(",")) >= {"forecast", "kafka", "postgres"}
    copies = [x for i, x in instructions(AIRFLOW) if i == "COPY"]
    assert any(c.split()[-2:] == ["dags/", "/opt/airflow/dags/"] for c in copies)  # the official chart's DAGs folder
    run = " ".join(a for i, a in instructions(AIRFLOW) if i == "RUN")
    assert '"apache-airflow==${AIRFLOW_VERSION}"' in run and "--constraint /tmp/kale/constraints.txt" in run
