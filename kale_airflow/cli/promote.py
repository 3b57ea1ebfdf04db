"""``kale promote MODEL VERSION``: a reviewer's promotion, recorded on the version.

The ``champion`` alias moves to the version, which is tagged ``kale.review=approved`` with
``kale.approved_by`` (``--by``, default the OS user) and ``kale.approved_at``; the champion it
replaces gets ``kale.superseded_by``/``kale.superseded_at``. When the control-plane database
exists the promotion is also announced there, so the autoscaler reloads at its next poke
(otherwise within its 10-minute recheck). Exit 0, or 2 naming the unknown model or version,
or the MLflow that cannot be reached (its URL masked).
"""

from __future__ import annotations

import argparse
import getpass

from kale_airflow.core.jobs import DEFAULT_JOB
from kale_airflow.registry.mlflow_registry import FORECASTER_MODEL, THROUGHPUT_MODEL, job_models, job_of_model

MODELS = {"forecaster": FORECASTER_MODEL, "throughput": THROUGHPUT_MODEL}


def model_name(text: str) -> str:
    """The registered model named by ``forecaster``, ``throughput`` or its registered name
    (a job's: ``kale-traffic-forecaster-<job>``)."""
    name = MODELS.get(text, text)
    if job_of_model(name) is None:
        raise argparse.ArgumentTypeError(f"unknown model {text!r}; use forecaster, throughput, "
                                         f"{FORECASTER_MODEL} or {THROUGHPUT_MODEL} (-<job> for a job's)")
    return name


def version_number(text: str) -> str:
    """A model version: ``3`` or ``v3``."""
    number = text[1:] if text[:1] in ("v", "V") else text
    if not number.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is no model version; write its number, e.g. 3 (or v3)")
    return str(int(number))


def os_user() -> str:
    """Who runs the command, for ``--by``'s default (``unknown`` where the OS cannot say)."""
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no USER/LOGNAME and no passwd entry (some containers)
        return "unknown"


def cmd_promote(args: argparse.Namespace) -> int:
    """Promote ``args.version`` of ``args.model`` and record who approved it."""
    from kale_airflow.cli.readonly import MissingState, mlflow_problem
    from kale_airflow.config import settings
    from kale_airflow.registry.mlflow_registry import promote, registry_client

    env = settings()
    if args.job:  # forecaster/throughput of that job
        args.model = job_models(args.job)[0 if args.model.startswith(FORECASTER_MODEL) else 1]
    by = args.by.strip()
    if not by:
        raise ValueError("--by must name who approves the promotion")
    problem = mlflow_problem(env.mlflow_uri)
    if problem:
        raise MissingState(f"cannot promote {args.model} v{args.version}: {problem}. Nothing was changed.")
    result = promote(registry_client(env.mlflow_uri), args.model, args.version, by)
    print(result.describe())
    if not result.already_champion:
        print(_announce(env.database_url, result))
    return 0


def _announce(database_url: str, result) -> str:
    """Tell the autoscaler (through the control-plane database, when it exists) to reload."""
    from kale_airflow.cli.readonly import control_plane_problem
    from kale_airflow.control.promotions import announce
    from kale_airflow.core.errors import KaleError
    from kale_airflow.store import StateStore, masked

    later = "the autoscaler picks the new champion up at its next registry check (within 10 minutes)"
    try:
        if control_plane_problem(database_url):
            return f"no control-plane database to announce it in: {later}"
        store = StateStore(database_url, job_of_model(result.model) or DEFAULT_JOB)
        announce(store, {"promoted": True, "version": result.version}, result.model)
    except KaleError as exc:
        return f"could not announce it in the control-plane database ({masked(exc)}): {later}"
    return "announced in the control-plane database: the autoscaler reloads the champions at its next poke"


def add_promote(sub) -> None:
    """Register ``kale promote`` on the ``kale`` parser."""
    what = "make a model version the champion, recording who approved it"
    pr = sub.add_parser("promote", help=what, description=f"{what[0].upper()}{what[1:]}. "
                        + __doc__.split("\n\n", 1)[1].replace("``", "").replace("%", "%%"))
    pr.add_argument("model", metavar="MODEL", type=model_name,
                    help=f"forecaster, throughput, {FORECASTER_MODEL} or {THROUGHPUT_MODEL}")
    pr.add_argument("version", metavar="VERSION", type=version_number, help="the version to promote, e.g. 3")
    pr.add_argument("--by", metavar="NAME", default=os_user(), help="who approves it (default: the OS user running the command)")
    pr.add_argument("--job", help="the job whose model it is, in a deployment of several (or name the model "
                                  f"{FORECASTER_MODEL}-JOB)")
    pr.set_defaults(func=cmd_promote)
