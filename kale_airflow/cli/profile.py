"""``kale profile``: measure the training job's throughput at a few world sizes, so a new
deployment's throughput model is fitted on its own job (see :mod:`kale_airflow.pipelines.profile`)."""

from __future__ import annotations

import argparse

from kale_airflow.reporting.results import write_json

REFIT = "airflow dags trigger kale_throughput_refit"


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of worker counts; write e.g. 1,2,4") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"worker counts must be >= 1, got {text!r}")
    return sizes


def format_profile(results) -> str:
    """The summary table: one row per world size."""
    lines = [f"{'workers':>7}  {'samples/s':>12}  {'per worker':>10}  {'observations':>12}  {'startup s':>9}",
             f"{'-' * 7}  {'-' * 12}  {'-' * 10}  {'-' * 12}  {'-' * 9}"]
    for r in results:
        rate = "-" if r.samples_per_s is None else f"{r.samples_per_s:,.0f}"
        per = "-" if r.samples_per_s is None else f"{r.samples_per_s / r.workers:,.0f}"
        start = "-" if r.startup_s is None else f"{r.startup_s:.1f}"
        lines.append(f"{r.workers:>7}  {rate:>12}  {per:>10}  {r.observations:>12}  {start:>9}")
    return "\n".join(lines)


def next_step(results, metrics_source: str) -> str:
    """What to do after a profile: refit on what it recorded, or why that would not work yet."""
    measured = [r.workers for r in results if r.observations]
    if len(measured) >= 2:
        text = (f"recorded {sum(r.observations for r in results)} observation(s) at {len(measured)} world sizes. "
                f"Next: fit the throughput model on them: {REFIT} (it runs hourly; with auto_promote the "
                "challenger becomes champion when it wins)")
    else:
        text = ("the throughput model needs observations at 2 or more world sizes; fix what the notes above say, "
                "then run kale profile again")
    if metrics_source != "embedded":
        text += (f"\nnote: KALE_METRICS_SOURCE={metrics_source}: the refit reads throughput from there, which does "
                 "not scrape these local profiling processes; they recorded into the control-plane database")
    return text


def cmd_profile(args: argparse.Namespace) -> int:
    """Run the job at each size, print a line per size, the summary table and the next step."""
    from kale_airflow.config import load_config
    from kale_airflow.pipelines.profile import ProfileOptions, profile_job

    report = args.report_every if args.report_every else min(5.0, max(0.5, args.seconds_per_size / 4))
    options = ProfileOptions(workers=args.workers, seconds_per_size=args.seconds_per_size, report_every_s=report,
                             startup_timeout_s=args.startup_timeout, stream_url=args.stream)
    config = load_config(args.job)
    if config.deployment.worker_backend != "local":
        print(f"note: worker_backend is {config.deployment.worker_backend}: this profiles the job as local processes "
              "on this machine; run it where the devices match your workers'")
    results = profile_job(config, options, say=lambda line: print(line, flush=True))
    print()
    print(format_profile(results))
    print()
    print(next_step(results, config.settings.metrics_source))
    write_json(args.json, {"stream": options.stream_url or config.deployment.stream_url,
                           "sizes": [r.to_dict() for r in results]})
    measured = sum(1 for r in results if r.observations)
    return 0 if measured >= min(2, len(results)) else 1


def add_profile(sub) -> None:
    """Register ``kale profile`` on the ``kale`` parser."""
    pr = sub.add_parser(
        "profile",
        help="measure the training job's samples/s at a few worker counts (what the throughput refit fits)",
        description=(
            "Run the training job at each world size in turn (local processes started by the job supervisor, the "
            "deployment's batch size, step time and device) on the deployment's stream, and let it record its "
            "samples/s in the control plane, as running workers do. Each size reads the stream from its start "
            "under its own consumer group (no commit of the deployment's workers moves) and checkpoints into a "
            "folder removed afterwards. Run it on a new deployment before the first generation: the throughput "
            "refit (kale_throughput_refit) fits only measured observations. A stream without samples is refused "
            "with the command that fills an embedded one; nothing is recorded for a job that ran dry."),
        epilog=f"Afterwards: {REFIT}. Exit status 0 when observations were recorded at 2 or more sizes (or at the one "
               "size asked for), 1 otherwise, 2 on a refusal.",
    )
    pr.add_argument("--workers", type=_sizes, default="1,2,4", metavar="N,N,...",
                    help="world sizes to run, in this order (default: 1,2,4)")
    pr.add_argument("--seconds-per-size", type=float, default=30.0, metavar="S",
                    help="seconds each size is measured after the job's first record; its startup comes on top "
                         "(default: 30)")
    pr.add_argument("--report-every", type=float, default=None, metavar="S",
                    help="seconds between the job's records (default: 5, or a quarter of --seconds-per-size "
                         "when that is shorter)")
    pr.add_argument("--startup-timeout", type=float, default=300.0, metavar="S",
                    help="seconds a job may take to start (torch import, rendezvous) before its size is given up "
                         "(default: 300)")
    pr.add_argument("--stream", metavar="URL", help="stream to train on (default: the deployment's stream_url)")
    pr.add_argument("--job", help="the deployment's job to profile (needed when it has several): its stream, "
                                  "trainer and throughput records")
    pr.add_argument("--json", metavar="OUT", help="also write each size's result (workers, samples_per_s, "
                                                   "observations, startup_s, measured_s, note) as JSON")
    pr.set_defaults(func=cmd_profile)
