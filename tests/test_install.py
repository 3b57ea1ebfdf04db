"""The light install: the wheel without extras, in a fresh venv, imports every DAG and the
plugin with torch, NeuralProphet and statsforecast absent; a task that needs an extra fails
with the pip command to run.

The fresh venv gets the wheel (``pip install --no-deps --no-index``) and, instead of a
network install of Airflow's ~150 dependencies, the light dependency set as a view of this
venv's site-packages with every heavy distribution left out; the test first checks that the
wheel's own requirements (no extras) are all satisfied by that view and name nothing heavy.

The images' install: the ``pip install`` of each Dockerfile under docker/, taken from the
Dockerfile itself (its extras, pins and constraints), run in a fresh venv with this venv's
site-packages as the index (``--no-index``; the CPU torch constraint here stands in for the
worker image's CUDA one): pip's resolver must find every requirement of those extras
satisfied, and the result runs ``kale --version``, imports every DAG from the folder the
Airflow image copies them into, and starts the worker module.
"""

import json
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "functorch", "torchgen", "torchmetrics", "pytorch_lightning", "lightning_fabric", "lightning",
         "neuralprophet", "statsforecast", "triton", "nvidia")
HEAVY_DISTS = {"torch", "neuralprophet", "statsforecast", "pytorch-lightning", "torchmetrics", "lightning-fabric"}

CHECK = r"""
import importlib.metadata as md, importlib.util, json, sys, warnings
warnings.simplefilter("ignore")
from packaging.requirements import Requirement

dist = md.distribution("kale-airflow")
unmet = []
for text in dist.requires or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an extra's requirement
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        unmet.append(f"{req} (missing)")
        continue
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        unmet.append(f"{req} (have {have})")

from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1], safe_mode=False)
from kale_airflow.ui.plugin import KalePlugin
from kale_airflow.get_provider_info import get_provider_info
import kale_airflow, kale_airflow.control.autoscaler, kale_airflow.registry.connection, kale_airflow.stream.connection

from kale_airflow.operators.failures import KaleFailure, fail_fast
needs = {}
for module in ("torch", "neuralprophet"):
    try:
        with fail_fast():
            importlib.import_module(module)
    except KaleFailure as exc:
        needs[module] = str(exc)

import tempfile
from kale_airflow.store import StateStore, migrate
StateStore("sqlite:///" + tempfile.mkdtemp() + "/kale.db")  # created at the head from the wheel's migrations
revisions = list(migrate.known_revisions())

print("RESULT" + json.dumps({
    "revisions": revisions, "unmet": unmet, "errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": sorted(bag.dag_ids),
    "plugin": KalePlugin.name, "provider": get_provider_info()["package-name"], "package": kale_airflow.__file__,
    "heavy_loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "neuralprophet", "statsforecast")),
    "heavy_findable": [m for m in ("torch", "neuralprophet", "statsforecast") if importlib.util.find_spec(m)],
    "needs": needs,
}))
"""


def build_wheel(tmp: Path) -> Path:
    """Build from a copy of the sources (setuptools writes build/ and egg-info next to them)."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "kale_airflow", src / "kale_airflow",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--quiet", "-w", str(tmp / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    return next((tmp / "dist").glob("kale_airflow-*.whl"))


def light_view(tmp: Path, heavy: bool = False) -> Path:
    """This venv's site-packages without our editable install and (unless ``heavy``) without
    the heavy distributions."""
    view = tmp / ("full-site" if heavy else "light-site")
    view.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        name = entry.name.lower()
        root = name.split("-")[0].split(".")[0]
        if (not heavy and (root in HEAVY or root.startswith("nvidia")) or "kale_airflow" in name
                or "kale-airflow" in name or name.startswith("__editable__") or name.endswith(".pth")
                or root == "__pycache__"):
            continue
        (view / entry.name).symlink_to(entry)
    return view


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.mark.slow
def test_wheel_without_extras_imports_every_dag_and_the_plugin(tmp_path, wheel):
    with __import__("zipfile").ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requires = [l.split(":", 1)[1].strip() for l in meta.splitlines() if l.startswith("Requires-Dist:")]
    core = [r for r in requires if "extra ==" not in r]
    assert not [r for r in core if r.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip()
                .lower() in HEAVY_DISTS], core
    extras = {l.split(":", 1)[1].strip() for l in meta.splitlines() if l.startswith("Provides-Extra:")}
    assert {"forecast", "worker", "kafka", "postgres", "prometheus", "all"} <= extras

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "--quiet",
                    str(wheel)], check=True, capture_output=True, timeout=300)
    fresh_site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip())
    (fresh_site / "light-deps.pth").write_text(str(light_view(tmp_path)) + "\n")

    home = tmp_path / "airflow"
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "AIRFLOW_HOME": str(home),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db", "KALE_HOME": str(tmp_path / "kale"),
           "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([str(py), "-c", CHECK, str(ROOT / "dags")], capture_output=True, text=True, env=env,
                         timeout=600, cwd=tmp_path)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads(line[len("RESULT"):])
    assert res["unmet"] == []  # every requirement of the light install is there
    assert res["revisions"] == ["0001", "0002", "0003"]  # the schema migrations ship in the wheel
    assert res["errors"] == {}
    assert res["dags"] == ["kale_autoscaler", "kale_forecaster_retrain", "kale_throughput_refit", "kale_training"]
    assert res["plugin"] == "kale" and res["provider"] == "kale-airflow"
    assert res["package"].startswith(str(venv))  # the installed wheel, not the source tree
    assert res["heavy_loaded"] == [] and res["heavy_findable"] == []
    assert "pip install 'kale-airflow[worker]'" in res["needs"]["torch"]
    assert "pip install 'kale-airflow[forecast]'" in res["needs"]["neuralprophet"]
    version = subprocess.run([str(venv / "bin" / "kale"), "--version"], capture_output=True, text=True, env=env,
                             timeout=120)
    assert version.stdout.strip() == "kale-airflow 0.1.0", version.stderr[-2000:]


# ------------------------------------------------------------ the images' install command
DOCKER = ROOT / "docker"
IMAGE_CHECK = r"""
import importlib, json, sys, warnings
warnings.simplefilter("ignore")
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1], safe_mode=False)
modules = {}
for name in sys.argv[2].split(","):
    try:
        importlib.import_module(name)
        modules[name] = "ok"
    except Exception as exc:  # noqa: BLE001 - reported below
        modules[name] = repr(exc)
print("RESULT" + json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": sorted(bag.dag_ids),
                              "modules": modules}))
"""
# What each extra must make importable.
EXTRA_MODULES = {"worker": "torch", "forecast": "neuralprophet,statsforecast", "kafka": "confluent_kafka",
                 "postgres": "psycopg"}


def dockerfile_pip_install(path: Path) -> list[str]:
    """The ``pip install`` of the Dockerfile's RUN instructions, tokenized, with its ARG
    defaults and the base image's AIRFLOW_VERSION substituted."""
    text = re.sub(r"\\\n", " ", "\n".join(l for l in path.read_text().splitlines() if not l.lstrip().startswith("#")))
    env = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    image = re.search(r"^FROM (\S+)", text, re.M).group(1)
    if image.startswith("apache/airflow:"):
        env["AIRFLOW_VERSION"] = image.split(":", 1)[1].split("-")[0]  # the base image sets it
    (command,) = [part.strip() for line in text.splitlines() if line.startswith("RUN ")
                  for part in line[4:].split("&&") if "pip install" in part]
    tokens = shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], command))
    return tokens[tokens.index("install") + 1:]


def local_install_args(tokens: list[str], wheel: Path) -> list[str]:
    """The Dockerfile's pip arguments with the image's files replaced by this checkout's, and
    no index: this venv's site-packages stand in for it."""
    out, skip = [], False
    for tok in tokens:
        if skip:
            skip = False
            continue
        if tok == "--extra-index-url":
            skip = True
            continue
        if tok.startswith("/tmp/kale/kale_airflow-"):
            out.append(str(wheel) + tok[tok.index("["):])
        elif tok.startswith("/tmp/kale/") and tok.endswith(".txt"):
            out.append(str(ROOT / "constraints.txt"))  # the worker image pins its base's CUDA torch instead
        else:
            assert not tok.startswith("/"), f"an image path the test does not map: {tok}"
            out.append(tok)
    return ["--no-index", *out]


@pytest.mark.slow
@pytest.mark.parametrize("image", ["worker", "airflow"])
def test_the_images_install_command_yields_a_working_kale_and_every_dag(tmp_path, wheel, image):
    tokens = dockerfile_pip_install(DOCKER / f"{image}.Dockerfile")
    extras = next(t for t in tokens if "kale_airflow-" in t).split("[", 1)[1].rstrip("]").split(",")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    fresh_site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip())
    (fresh_site / "deps.pth").write_text(str(light_view(tmp_path, heavy=True)) + "\n")
    # pip resolves the extras against what is installed: an unmet requirement fails here (no index)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install",
                           *local_install_args(tokens, wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    home = tmp_path / "airflow"
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "AIRFLOW_HOME": str(home),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db", "KALE_HOME": str(tmp_path / "kale"),
           "PYTHONWARNINGS": "ignore"}
    version = subprocess.run([str(venv / "bin" / "kale"), "--version"], capture_output=True, text=True, env=env,
                             timeout=120)
    assert version.stdout.strip() == "kale-airflow 0.1.0", version.stderr[-2000:]
    modules = ",".join(EXTRA_MODULES[e] for e in extras)
    out = subprocess.run([str(py), "-c", IMAGE_CHECK, str(ROOT / "dags"), modules], capture_output=True, text=True,
                         env=env, timeout=600, cwd=tmp_path)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads(line[len("RESULT"):])
    assert res["errors"] == {}
    assert res["dags"] == ["kale_autoscaler", "kale_forecaster_retrain", "kale_throughput_refit", "kale_training"]
    assert set(res["modules"].values()) == {"ok"}, res["modules"]
    if image == "worker":  # what the image's build runs after the install
        helped = subprocess.run([str(py), "-m", "kale_airflow.runtime.worker", "--help"], capture_output=True,
                                text=True, env=env, timeout=300, cwd=tmp_path)
        assert helped.returncode == 0 and "--worker-id" in helped.stdout, helped.stderr[-2000:]


def test_the_dockerfile_install_commands_are_what_the_install_test_runs():
    worker = dockerfile_pip_install(DOCKER / "worker.Dockerfile")
    assert worker == ["--no-cache-dir", "--constraint", "/tmp/kale/torch-constraint.txt",
                      "/tmp/kale/kale_airflow-0.1.0-py3-none-any.whl[worker,kafka,postgres]"]
    airflow = dockerfile_pip_install(DOCKER / "airflow.Dockerfile")
    assert airflow == ["--no-cache-dir", "--constraint", "/tmp/kale/constraints.txt", "--extra-index-url",
                       "https://download.pytorch.org/whl/cpu", "apache-airflow==3.3.2",
                       "/tmp/kale/kale_airflow-0.1.0-py3-none-any.whl[forecast,kafka,postgres]"]
    local = local_install_args(airflow, Path("/w/kale_airflow-0.1.0-py3-none-any.whl"))
    assert local == ["--no-index", "--no-cache-dir", "--constraint", str(ROOT / "constraints.txt"),
                     "apache-airflow==3.3.2", "/w/kale_airflow-0.1.0-py3-none-any.whl[forecast,kafka,postgres]"]
