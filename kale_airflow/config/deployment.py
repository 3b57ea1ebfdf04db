"""The deployment's configuration, validated once into typed, frozen objects.

Read from the YAML file ``$KALE_CONFIG`` (or ``$KALE_HOME/kale.yaml`` when present), else
defaults for the embedded default. The Helm chart renders the same file into a ConfigMap.

.. code-block:: yaml

    stream_url: kafka://kafka.kale:9092/samples   # default sqlite:///$KALE_HOME/stream.db
    worker_backend: kubernetes                    # or local
    min_workers: 1
    max_workers: 64
    partitions: 64
    slo_s: 300
    rescale_downtime_s: 90
    poll_interval_s: 15
    kale: {horizon_s: 3600, forecast_quantile: 0.8}     # any KaleConfig field (docs/configuration.md)
    kubernetes: {image: ..., namespace: kale-training, gpus_per_worker: 1}
    worker_device: auto                           # or cpu, cuda; worker_amp: true for bf16 on CUDA

Several jobs on one GPU budget: every setting above is the jobs' default, and each entry of
``jobs:`` overrides what it names (``kale:``, ``kubernetes:`` and ``alerts:`` key by key):

.. code-block:: yaml

    fleet: {gpus: 96}                             # the arbiter shares these between the jobs
    jobs:
      - {name: ranking, stream_url: "kafka://kafka.kale:9092/ranking", priority: 3, max_workers: 64}
      - name: ads
        stream_url: kafka://kafka.kale:9092/ads
        schedule_overrides: [{cron: "0 19 * * *", duration: 4h, min_workers: 16, name: final}]

A file without ``jobs:`` is one job named ``default``.

Types are strict (``"15"`` is not a number; an integer is a valid float); every error
names the file, the field, what was expected and what was found.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from functools import cached_property
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from kale_airflow.config.environment import DEFAULT_JOB, Settings
from kale_airflow.core.errors import KaleError
from kale_airflow.core.fleet import VIOLATION_GPUS, Override, check_floors
from kale_airflow.core.policies import KaleConfig, Limits

STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)
# The environment variables the Kafka stream reads its credentials from (kale_airflow.stream.kafka).
KafkaSecretEnv = Literal["KALE_KAFKA_CONFIG", "KALE_KAFKA_SASL_USERNAME", "KALE_KAFKA_SASL_PASSWORD"]
SecretKey = Annotated[str, StringConstraints(pattern=r"^[-._a-zA-Z0-9]{1,253}$")]
_DNS_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
# A job's name goes into DAG ids, MLflow model names, folder names and control-plane rows.
JOB_NAME = r"^[a-z0-9]([-a-z0-9_]{0,38}[a-z0-9])?$"


def dag_id(base: str, job: str) -> str:
    """The id of a job's DAG: ``base`` for the ``default`` job (a single-job deployment's
    ids do not change), ``base__<job>`` for the others."""
    return base if job == DEFAULT_JOB else f"{base}__{job}"


def job_of_dag(dag: str) -> str:
    """The job a Kale DAG id is of (the inverse of :func:`dag_id`)."""
    return dag.split("__", 1)[1] if "__" in dag else DEFAULT_JOB


class ConfigError(KaleError, ValueError):
    """The configuration is invalid; the message names the file, the field and what to do."""


class KubernetesWorkerConfig(BaseModel):
    """Where and how GPU worker pods run (Helm values feed these)."""

    model_config = STRICT

    image: str = Field("ghcr.io/kale-airflow/worker:0.1.0",
                       description="Container image of the worker pods (it must ship kale-airflow with the worker extra).")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Pull policy of the worker image (the Helm chart sets it from "
                                    "`images.worker.pullPolicy`).")
    image_pull_secrets: list[Annotated[str, StringConstraints(pattern=_DNS_NAME)]] = Field(
        default_factory=list, description="Secrets (type `kubernetes.io/dockerconfigjson`, in `namespace`) the "
                                          "kubelet pulls the worker image with; the Helm chart sets them from "
                                          "`images.worker.pullSecrets`.")
    priority_class_name: str | None = Field(None, pattern=_DNS_NAME,
                                            description="PriorityClass of the worker pods (null: the cluster's "
                                                        "default); the Helm chart sets it from "
                                                        "`workerPods.priorityClassName`.")
    namespace: str = Field("kale-training", description="Namespace the worker pods run in.")
    gpus_per_worker: int = Field(1, ge=0, description="`nvidia.com/gpu` limit of each worker pod (0: no GPU limit).")
    cpu_request: str = Field("4", description="CPU request of each worker pod.")
    memory_request: str = Field("16Gi", description="Memory request of each worker pod.")
    memory_limit: str = Field("16Gi", description="Memory limit of each worker pod.")
    node_selector: dict[str, str] = Field(default_factory=lambda: {"nvidia.com/gpu.present": "true"},
                                          description="Node selector of the worker pods (GPU nodes).")
    tolerations: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        description="Tolerations of the worker pods (the GPU nodes' taint).")
    checkpoint_claim: str = Field("kale-checkpoints",
                                  description="PersistentVolumeClaim mounted at `/checkpoints`; only rank 0 uses it, "
                                              "so ReadWriteOnce works only when the pods share a node "
                                              "(use ReadWriteMany storage).")
    service_account: str = Field("kale-worker", description="Service account of the worker pods (no API access needed).")
    run_as_user: int = Field(1000, description="Non-root user id the worker containers run as (0 is refused).")
    grace_period_s: int = Field(120, ge=0, description="Seconds a stopping pod gets to checkpoint before it is killed.")
    kubernetes_conn_id: str = Field("kubernetes_default",
                                    description="Airflow connection of the Kubernetes cluster the pods start in.")
    # The control-plane database URL (KALE_DATABASE_URL) reaches the pods only from this
    # Secret (a secretKeyRef, never a plain value in the pod spec); the chart creates it or
    # names an existing one.
    database_secret: str = Field("kale-database", pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
                                 description="Secret holding `KALE_DATABASE_URL` for the pods (a `secretKeyRef`, never "
                                             "a plain value in the pod spec); the Helm chart sets it from `database.*`.")
    database_secret_key: str = Field("url", pattern=r"^[-._a-zA-Z0-9]{1,253}$",
                                     description="Key of the URL in `database_secret`.")
    kafka_secret: str | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
                                     description="Secret holding the Kafka credentials of the pods, each key named "
                                                 "in `kafka_secret_keys` as an environment variable (a "
                                                 "`secretKeyRef`, never a plain value); the Helm chart sets it from "
                                                 "`kafka.*`. null: none.")
    kafka_secret_keys: dict[KafkaSecretEnv, SecretKey] = Field(
        default_factory=dict, description="Environment variable -> key in `kafka_secret`: `KALE_KAFKA_CONFIG` (a JSON "
                                          "object of librdkafka settings), `KALE_KAFKA_SASL_USERNAME`, "
                                          "`KALE_KAFKA_SASL_PASSWORD`.")
    pool: str = Field("kale_gpu", min_length=1, max_length=256,
                      description="Airflow pool of the mapped worker-pod tasks; create it with `max_workers` slots "
                                  "and `--include-deferred`.")
    # A node autoscaler adding a GPU node takes minutes; a large GPU image takes long to pull.
    schedule_timeout_s: int = Field(1800, gt=0, description="Seconds a Pending pod may wait to be scheduled.")
    startup_timeout_s: int = Field(600, gt=0, description="Seconds from scheduled to running (pulling a large image).")
    deferrable: bool = Field(True, description="Deferrable pods: the triggerer watches each pod and the Airflow "
                                               "worker slot is freed.")
    poll_interval_s: float = Field(10.0, gt=0, description="Seconds between the triggerer's pod status reads.")
    logging_interval_s: int | None = Field(300, gt=0, description="Seconds between log fetches while a pod runs "
                                                                  "(null: logs at the end only).")

    @field_validator("run_as_user")
    @classmethod
    def _not_root(cls, uid: int) -> int:
        if uid <= 0:
            raise ValueError(f"run_as_user {uid} is root or invalid; workers run as a non-root user (e.g. 1000)")
        return uid

    @model_validator(mode="after")
    def _kafka_secret_with_its_keys(self) -> "KubernetesWorkerConfig":
        if bool(self.kafka_secret) != bool(self.kafka_secret_keys):
            raise ValueError("kafka_secret and kafka_secret_keys go together: name the Secret and which of its keys "
                             "become KALE_KAFKA_CONFIG / KALE_KAFKA_SASL_USERNAME / KALE_KAFKA_SASL_PASSWORD, or "
                             "set neither")
        return self


class AlertsConfig(BaseModel):
    """Where alerts go: an Airflow notifier class (e.g.
    ``airflow.providers.smtp.notifications.smtp.SmtpNotifier`` or the Slack provider's
    ``SlackNotifier``) built with ``notifier_kwargs``; without one, alerts are only logged.
    Templated notifier fields see ``{{ kale_alert.title }}``, ``{{ kale_alert.message }}``
    and ``{{ kale_alert.kind }}``."""

    model_config = STRICT

    notifier: str | None = Field(None, pattern=r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$",
                                 description="Dotted path of an Airflow notifier class (null: alerts are only logged).")
    notifier_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments the notifier is "
                                                                              "built with.")
    slo_risk_fraction: float = Field(0.8, gt=0, description="The freshness lag counts as \"SLO at risk\" from this "
                                                            "fraction of `slo_s`.")
    slo_risk_minutes: float = Field(10.0, gt=0, description="Alert after the SLO has been at risk this long.")
    task_failures: bool = Field(True, description="Alert when a retrain, refit, training or autoscaler task fails "
                                                  "for good (`on_failure_callback`).")
    review_pending: bool = Field(True, description="Alert when a challenger is held for review in MLflow.")


class ScheduleOverride(BaseModel):
    """A calendar window bounding a job's workers: ``cron`` with ``duration`` (``4h``,
    ``90m``; every cron time, UTC) or ``start`` and ``end`` (dates or date-times, UTC)."""

    model_config = STRICT

    name: str = Field("", description="Shown in decisions made inside the window.")
    cron: str | None = Field(None, description="Five-field cron expression (UTC) of the window's opening times.")
    duration: str | None = Field(None, description="How long each cron window lasts (`4h`, `90m`, `3600s`).")
    start: str | None = Field(None, description="A dated window's start (UTC), instead of `cron`.")
    end: str | None = Field(None, description="A dated window's end (UTC, excluded).")
    min_workers: int | None = Field(None, ge=0, description="Floor while the window is open.")
    max_workers: int | None = Field(None, ge=0, description="Cap while the window is open.")

    @model_validator(mode="after")
    def _a_valid_window(self) -> "ScheduleOverride":
        self.override  # noqa: B018 - the window's own rules and messages
        return self

    @cached_property
    def override(self) -> Override:
        """The window as the pure arbiter takes it."""
        return Override.from_dict(self.model_dump(exclude_none=True, exclude_defaults=False))


class FleetConfig(BaseModel):
    """The GPU budget the jobs of ``jobs:`` share."""

    model_config = STRICT

    gpus: int = Field(gt=0, description="Workers (GPUs) all jobs together may run; the arbiter shares them by the "
                                        "priority-weighted cost of denying each job a worker. Not below the sum "
                                        "of the jobs' `min_workers`.")
    violation_gpus: float = Field(VIOLATION_GPUS, gt=0, description="GPU-seconds one second of risked SLO "
                                                                    "violation costs, against the workers' GPU "
                                                                    "time.")
    demand_ttl_s: float = Field(300.0, gt=0, description="Seconds a job's last recorded demand counts for the "
                                                         "others' arbitration (a job whose autoscaler stopped "
                                                         "asking keeps only the workers it runs).")


# The policy's own fields (core.policies.KaleConfig) as a strict model, so ``kale:`` is
# validated field by field; SLO, downtime and interval come from the top level.
_FROM_TOP_LEVEL = {"slo_s", "rescale_downtime_s", "interval_s"}
_KALE_TYPES = typing.get_type_hints(KaleConfig)
KalePolicySettings = create_model(
    "KalePolicySettings", __config__=STRICT,
    **{f.name: (_KALE_TYPES[f.name], f.default) for f in dataclasses.fields(KaleConfig) if f.name not in _FROM_TOP_LEVEL},
)


class Deployment(BaseModel):
    """Everything the autoscaler and the training DAG need to know."""

    model_config = STRICT

    stream_url: str = Field(description="Where the samples are: `sqlite:///PATH` (the embedded stream), "
                                        "`kafka://HOST:PORT[,HOST:PORT]/TOPIC`, or `airflow-conn://CONN_ID/TOPIC` "
                                        "(a `kale_kafka` connection). Never credentials: a Kafka URL with a user or "
                                        "password is refused. A file that omits it gets "
                                        "`sqlite:///$KALE_HOME/stream.db`.")
    job: str = Field(DEFAULT_JOB, pattern=JOB_NAME,
                     description="The job's name (an entry of `jobs:` sets it from `name`): its DAG ids "
                                 "(`kale_autoscaler__<job>`), MLflow models and control-plane rows carry it. A file "
                                 "without `jobs:` is the job `default`, whose DAGs keep their plain ids.")
    priority: float = Field(1.0, gt=0, description="Weight of the job's costs when the fleet's GPUs do not cover "
                                                   "every job's need.")
    schedule_overrides: list[ScheduleOverride] = Field(
        default_factory=list, description="Calendar windows with a floor or a cap on the workers (applied as "
                                          "limits; decisions inside one say `override`).")
    group: str = Field("kale", description="Prefix of the consumer groups workers commit to (one group per slice, "
                                           "`{group}/p{partition}:{lo}-{hi}`).")
    worker_backend: Literal["local", "kubernetes"] = Field(
        "local", description="`local`: supervised processes on this machine; `kubernetes`: one "
                             "KubernetesPodOperator pod per worker (settings under `kubernetes`).")
    min_workers: int = Field(1, description="Fewest workers (at least 1).")
    max_workers: int = Field(8, description="Most workers (at least `min_workers`).")
    partitions: int | None = Field(None, description="Partitions of the stream; caps the useful workers "
                                                     "(null: `max_workers` is the cap). Not below `min_workers`.")
    slo_s: float = Field(300.0, gt=0, description="Freshness SLO: the most seconds the oldest unprocessed sample "
                                                  "may wait.")
    rescale_downtime_s: float = Field(90.0, ge=0, description="Seconds a rescale pauses training (checkpoint, "
                                                              "restart, restore): the floor of the measured pause "
                                                              "the policy plans with.")
    poll_interval_s: float = Field(15.0, gt=0, description="Seconds between the autoscaler's observations and "
                                                           "decisions.")
    bin_s: float = Field(300.0, gt=0, description="Seconds per bin of the traffic history the autoscaler records "
                                                  "and forecasts from.")
    worker_batch_size: int = Field(512, ge=1, description="Samples per training step and rank.")
    worker_checkpoint_every_s: float = Field(
        60.0, ge=0, description="At most this many seconds of training between the workers' checkpoints and the stream "
                                "commits they carry (more often every 50 steps): a crash replays since the last one. "
                                "The autoscaler measures the backlog and the freshness lag from the positions the "
                                "running ranks report about every second, trusted this long, and the commits. "
                                "0: every 50 steps only.")
    worker_step_time_s: float = Field(0.0, ge=0, description="Emulated accelerator step time per batch, for demos "
                                                             "on CPU (0: no emulation).")
    worker_device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="The workers' torch device: `auto` (CUDA when the worker sees a GPU, else CPU), `cpu`, "
                            "or `cuda` (a worker without a GPU fails at start, naming this setting).")
    worker_amp: bool = Field(False, description="bf16 mixed precision (`torch.autocast`) on CUDA; ignored on CPU.")
    trainer: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
                                description="The model the workers train: `module:attribute` of a "
                                            "`kale_airflow.runtime.trainer.Trainer` (or a class or function making "
                                            "one), importable in the worker's environment (the worker image on "
                                            "Kubernetes); null: the reference click-through model.")
    producer: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
                                 description="What `kale demo` (and its profiling) writes into the embedded stream "
                                             "for `trainer`: `module:attribute` of a function `(n, seed)` returning "
                                             "`n` payloads (bytes) that the trainer decodes; null: the reference "
                                             "model's synthetic click-through samples. The workers never use it.")
    worker_warm_wait_s: float = Field(300.0, ge=0, description="Warm ranks: after a generation stops, each rank "
                                                               "the next one keeps waits this long for it to be "
                                                               "assigned and for its ranks to meet, then takes the "
                                                               "model from a surviving rank's memory (a rescale in "
                                                               "seconds; a scale-up adds ranks, which the local pool "
                                                               "keeps as spares (`worker_standby`), a scale-down "
                                                               "stops only the removed ones). Past it, "
                                                               "or after a crash, the generation restarts from the "
                                                               "checkpoint. On Kubernetes it must cover an added "
                                                               "pod's scheduling and start. 0: every generation is "
                                                               "a new job.")
    worker_standby: int = Field(4, ge=0, le=64, description="Local backend with warm ranks: how many spare rank "
                                                           "processes the pool keeps started above the current "
                                                           "generation's size (never beyond `max_workers`). A spare "
                                                           "has imported the trainer and built the model, holds no "
                                                           "GPU memory, and joins as soon as a larger generation "
                                                           "names its slot, so a scale-up does not wait for "
                                                           "processes to start (each one costs the memory of an "
                                                           "idle rank). 0: start the added ranks when the "
                                                           "generation is named. Kubernetes starts pods instead.")
    handover_timeout_s: float = Field(180.0, gt=0, description="How long a new generation waits for the workers it "
                                                               "supersedes to checkpoint and stop (they notice within "
                                                               "a report interval; pods get their grace period) "
                                                               "before it fails.")
    kale: KalePolicySettings = Field(default_factory=KalePolicySettings,  # type: ignore[valid-type]
                                     description="The policy's tunables (`KaleConfig`); its SLO, downtime and "
                                                 "poll interval come from the top level.")
    kubernetes: KubernetesWorkerConfig = Field(default_factory=KubernetesWorkerConfig,
                                               description="Worker pod settings, used by the `kubernetes` backend.")
    shadow: bool = Field(False, description="Shadow mode: observe, decide and record every decision "
                                            "(`applied: false`) beside the autoscaler already in charge (HPA, KEDA, "
                                            "a person); never start or stop a worker.")
    alerts: AlertsConfig = Field(default_factory=AlertsConfig, description="Where alerts go.")
    fleet: FleetConfig | None = Field(None, description="The GPU budget the jobs share (null: each job is bounded "
                                                        "by its own limits only).")
    jobs: list[dict[str, Any]] | None = Field(
        None, description="Several training jobs on one deployment: each entry has a `name` and overrides any "
                          "setting above for that job (`kale`, `kubernetes`, `alerts` key by key). null: one "
                          "job, `default`.")

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "Deployment":
        self.limits  # noqa: B018 - min/max/partitions, with the policy's own messages
        self.kale_config  # noqa: B018 - e.g. lookahead_s must cover rescale_downtime_s
        self.all_jobs  # noqa: B018 - every job valid, names and streams apart, the budget above the floors
        return self

    @cached_property
    def all_jobs(self) -> dict[str, "Deployment"]:
        """Every job's own settings by name (one, ``default`` or the file's ``job``, without
        ``jobs:``)."""
        if self.jobs is None:
            jobs = {self.job: self}
        else:
            if not self.jobs:
                raise ValueError("jobs: is empty; list at least one job (each with a name) or remove jobs:")
            base = self.model_dump(exclude={"jobs", "job"}, exclude_unset=True)  # the fleet too: every job sees it
            jobs = {}
            for i, entry in enumerate(self.jobs):
                name = entry.get("name")
                if not isinstance(name, str) or not re.match(JOB_NAME, name):
                    raise ValueError(f"jobs[{i}]: every job needs a name of lowercase letters, digits, - and _ "
                                     f"(at most 40), got {name!r}")
                if name in jobs:
                    raise ValueError(f"jobs[{i}]: the name {name!r} is used twice; job names must differ")
                own = {k: v for k, v in entry.items() if k != "name"}
                if {"jobs", "fleet", "job"} & set(own):
                    raise ValueError(f"jobs[{i}] ({name}): jobs, fleet and job are set at the top level only")
                merged = {**base, **own, "job": name}
                for section in ("kale", "kubernetes", "alerts"):
                    if isinstance(own.get(section), dict) and isinstance(base.get(section), dict):
                        merged[section] = {**base[section], **own[section]}
                try:
                    jobs[name] = Deployment.model_validate(merged)
                except ValidationError as exc:
                    raise ValueError("\n  ".join(f"jobs[{i}] ({name}) {line}" for line in _problems(exc))) from None
        streams: dict[tuple[str, str], str] = {}
        for name, job in jobs.items():
            other = streams.setdefault((job.stream_url, job.group), name)
            if other != name:
                raise ValueError(f"jobs {other} and {name} read {job.stream_url} with the same group {job.group!r}: "
                                 "their workers would share commits; give one its own group or stream_url")
        if self.fleet is not None:
            check_floors({name: job.min_workers for name, job in jobs.items()}, self.fleet.gpus)
        return jobs

    def for_job(self, name: str | None) -> "Deployment":
        """The settings of job ``name`` (None: the only job; a file with several jobs must name one)."""
        if name is None:
            if len(self.all_jobs) > 1:
                raise ConfigError(f"this deployment has {len(self.all_jobs)} jobs ({', '.join(self.all_jobs)}); "
                                  "name one (the DAGs of a job pass theirs)")
            return next(iter(self.all_jobs.values()))
        if name not in self.all_jobs:
            raise ConfigError(f"no job {name!r} in this deployment; its jobs: {', '.join(self.all_jobs)}")
        return self.all_jobs[name]

    @cached_property
    def limits(self) -> Limits:
        """Worker bounds."""
        return Limits(self.min_workers, self.max_workers, self.partitions)

    @cached_property
    def kale_config(self) -> KaleConfig:
        """The policy settings: SLO, downtime and poll interval from the top level, the rest from ``kale:``."""
        return KaleConfig(**self.kale.model_dump(), slo_s=self.slo_s, rescale_downtime_s=self.rescale_downtime_s,
                          interval_s=self.poll_interval_s)


_SECTIONS = {(): Deployment, ("kale",): KalePolicySettings, ("kubernetes",): KubernetesWorkerConfig,
             ("alerts",): AlertsConfig, ("fleet",): FleetConfig}


def explain(exc: ValidationError, source: str) -> ConfigError:
    """One line per problem: the field, what was expected, what was found (unknown keys list the allowed ones)."""
    return ConfigError(f"{source}: invalid configuration:\n  " + "\n  ".join(_problems(exc)))


def _problems(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        field = ".".join(loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            allowed = sorted(_SECTIONS.get(loc[:-1], Deployment).model_fields)
            lines.append(f"{field}: unknown setting; allowed here: {', '.join(allowed)}")
        elif err["type"] == "value_error":
            lines.append(f"{field}: {str(err.get('ctx', {}).get('error', err['msg']))}")
        else:
            got = err.get("input")
            lines.append(f"{field}: {err['msg'].lower()}, got {got!r} ({type(got).__name__})")
    return lines


def parse_deployment(data: dict, source: str = "configuration") -> Deployment:
    """Validate a mapping of settings (e.g. parsed YAML) into a :class:`Deployment`."""
    try:
        return Deployment.model_validate(data)
    except ValidationError as exc:
        raise explain(exc, source) from None


def load_deployment(settings: Settings) -> Deployment:
    """Read and validate the configuration file (or use the embedded defaults)."""
    path = settings.config_file or settings.home / "kale.yaml"
    data: Any = {}
    if path.exists():
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must be a mapping of settings, got a {type(data).__name__}")
    elif settings.config_file is not None:
        raise ConfigError(f"KALE_CONFIG points to {path}, which does not exist; create it or unset KALE_CONFIG")
    data.setdefault("stream_url", f"sqlite:///{settings.stream_db}")
    return parse_deployment(data, str(path))
