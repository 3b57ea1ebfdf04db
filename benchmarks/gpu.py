"""GPU benchmark (issue 16): the reference worker's training step on each visible GPU, fp32
and bf16 autocast, with a CPU comparison line, and the checkpoint + restore time on the GPU.

    python benchmarks/gpu.py [--json OUT] [--steps 200] [--batch-size 4096] [--cpu-steps 20]

It measures what a worker rank runs per step (``Worker.train_batch``: the host batch copied
to the device through pinned memory, forward, backward, Adam), on batches of generated CTR
samples; the stream read is left out (``benchmarks/runtime.py`` and ``kafka.py`` measure
it). Checkpoint and restore are the worker's own (``Worker.checkpoint``, with its fsync, and
``Worker.restore``). Without a GPU it says so, writes ``{"gpu": null, "reason": ...}`` with
the CPU line, and exits 0.

Needs torch, numpy and this package (with prometheus-client, which the worker imports).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
try:
    import kale_airflow  # noqa: F401 - installed, or run from a source tree
except ImportError:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kale_airflow.reporting.results import write_json  # noqa: E402
from kale_airflow.runtime.samples import generate  # noqa: E402
from kale_airflow.runtime.worker import Worker  # noqa: E402
from kale_airflow.stream.embedded import EmbeddedStream  # noqa: E402

POOL = 8  # distinct generated batches, cycled (generating one per step would time numpy, not the GPU)
WARMUP = 10


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def worker_on(device: str, tmp: Path, batch: int, amp: bool = False, gpu: int = 0) -> Worker:
    """A lone worker rank (no slices, an empty stream) on ``device``; ``gpu`` is its CUDA index."""
    if device == "cuda":
        os.environ["LOCAL_RANK"] = str(gpu)  # how the worker picks its GPU (select_device)
    stream = EmbeddedStream(tmp / "empty.db", partitions=1)
    return Worker(stream, "bench", [], tmp / f"ck-{device}{gpu}-{amp}", batch_size=batch, device=device, amp=amp)


def train_speed(w: Worker, steps: int, batch: int) -> dict:
    """Samples/s of ``steps`` training steps of ``batch`` samples (after a warm-up)."""
    pool = [generate(batch, seed) for seed in range(POOL)]
    for i in range(WARMUP):
        w.train_batch(pool[i % POOL])
    _sync(w.device)
    t0 = time.perf_counter()
    for i in range(steps):
        losses = w.train_batch(pool[i % POOL])
    _sync(w.device)
    elapsed = time.perf_counter() - t0
    return {"device": str(w.device), "amp_bf16": w.amp, "steps": steps, "batch_size": batch,
            "samples_per_s": steps * batch / elapsed, "step_ms": 1e3 * elapsed / steps,
            "last_loss": float(losses.detach().float().mean())}


def checkpoint_speed(w: Worker, repeats: int = 5) -> dict:
    """Median seconds of the worker's checkpoint (save + fsync) and of its restore onto the device."""
    saves, loads = [], []
    for _ in range(repeats):
        _sync(w.device)
        t0 = time.perf_counter()
        w.checkpoint()
        saves.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        w.restore()
        _sync(w.device)
        loads.append(time.perf_counter() - t0)
    return {"checkpoint_s": statistics.median(saves), "restore_s": statistics.median(loads),
            "bytes": w.checkpoint_path.stat().st_size}


def gpu_rows(args, tmp: Path) -> list[dict]:
    rows = []
    for i in range(min(torch.cuda.device_count(), args.gpus or torch.cuda.device_count())):
        row = {"index": i, "name": torch.cuda.get_device_name(i)}
        bf16 = not args.no_amp and torch.cuda.is_bf16_supported()
        for amp in (False, True) if bf16 else (False,):
            w = worker_on("cuda", tmp, args.batch_size, amp, gpu=i)
            row["bf16" if amp else "fp32"] = r = train_speed(w, args.steps, args.batch_size)
            print(f"GPU {i} ({row['name']}), {'bf16 autocast' if amp else 'fp32'}: {r['samples_per_s']:,.0f} "
                  f"samples/s ({r['step_ms']:.2f} ms per step of {args.batch_size})", flush=True)
        row["checkpoint"] = c = checkpoint_speed(w)
        print(f"GPU {i}: checkpoint {c['checkpoint_s'] * 1e3:.0f} ms, restore {c['restore_s'] * 1e3:.0f} ms "
              f"({c['bytes'] / 1e6:.1f} MB)", flush=True)
        rows.append(row)
    return rows


def no_gpu_reason() -> str:
    return (f"torch {torch.__version__} sees no CUDA GPU (CUDA build: {torch.version.cuda or 'none, a CPU-only torch'}"
            f"; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "gpu.json"))
    ap.add_argument("--steps", type=int, default=200, help="timed training steps per GPU and precision")
    ap.add_argument("--batch-size", type=int, default=4096, help="samples per step")
    ap.add_argument("--cpu-steps", type=int, default=20, help="timed steps of the CPU comparison (0: none)")
    ap.add_argument("--gpus", type=int, default=0, help="benchmark the first N GPUs (0: every visible GPU)")
    ap.add_argument("--no-amp", action="store_true", help="fp32 only (skip the bf16 autocast run)")
    args = ap.parse_args(argv)
    report: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "steps": args.steps,
                    "batch_size": args.batch_size}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        if torch.cuda.is_available():
            report["gpu"] = gpu_rows(args, tmp)
        else:
            report["gpu"], report["reason"] = None, no_gpu_reason()
            print(f"no GPU: {report['reason']}; nothing to measure on a GPU", flush=True)
        if args.cpu_steps:
            report["cpu"] = r = train_speed(worker_on("cpu", tmp, args.batch_size), args.cpu_steps, args.batch_size)
            print(f"CPU comparison ({torch.get_num_threads()} threads): {r['samples_per_s']:,.0f} samples/s "
                  f"({r['step_ms']:.1f} ms per step of {args.batch_size})", flush=True)
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
