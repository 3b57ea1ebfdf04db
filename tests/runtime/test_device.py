"""The worker's training device: selection from the configuration, the clear failure when a GPU
was asked for and is not there, and the setting's way from the deployment file to the worker."""

import pytest
import torch

from kale_airflow.config.deployment import ConfigError, parse_deployment
from kale_airflow.core.slices import Slice
from kale_airflow.runtime.backends import WorkerSpec
from kale_airflow.runtime.worker import DeviceError, Worker, build_arg_parser, select_device
from kale_airflow.stream.embedded import EmbeddedStream


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


def test_auto_trains_on_the_cpu_without_a_gpu(no_gpu):
    assert select_device("auto") == torch.device("cpu")
    assert select_device() == torch.device("cpu")


def test_auto_takes_the_gpu_when_torch_sees_one_and_spreads_ranks_over_them(two_gpus, monkeypatch):
    assert select_device("auto", rank=0) == torch.device("cuda", 0)
    assert select_device("auto", rank=3) == torch.device("cuda", 1)  # rank modulo the visible GPUs
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert select_device("cuda", rank=3) == torch.device("cuda", 0)  # the launcher's local rank wins


def test_explicit_cpu_stays_on_the_cpu_even_with_a_gpu(two_gpus):
    assert select_device("cpu", rank=1) == torch.device("cpu")


def test_cuda_requested_without_a_gpu_fails_naming_the_setting_and_the_fix(no_gpu):
    with pytest.raises(DeviceError) as err:
        select_device("cuda")
    msg = str(err.value)
    assert "worker_device is 'cuda'" in msg and "sees no GPU" in msg
    assert "gpus_per_worker" in msg and "worker_device: auto" in msg  # what to do about it


def test_an_unknown_device_is_refused():
    with pytest.raises(DeviceError, match="'gpu' is not one of auto, cpu, cuda"):
        select_device("gpu")


def test_a_worker_asked_for_cuda_without_a_gpu_fails_before_training(no_gpu, tmp_path):
    stream = EmbeddedStream(tmp_path / "s.db", partitions=1)
    with pytest.raises(DeviceError):
        Worker(stream, "g", [Slice(0)], tmp_path / "ck", device="cuda")
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", device="cpu", amp=True)
    assert w.device == torch.device("cpu") and w.amp is False  # mixed precision is for CUDA only


def test_the_deployment_setting_reaches_the_worker_command_line(tmp_path):
    dep = parse_deployment({"stream_url": "sqlite:///s.db", "worker_device": "cuda", "worker_amp": True})
    spec = WorkerSpec("sqlite:///s.db", str(tmp_path), device=dep.worker_device, amp=dep.worker_amp)
    args = build_arg_parser().parse_args(spec.command("g1", 0, 1, {"assignment": {"0": [["0", 1.0]]}})[3:])
    assert (args.device, args.amp) == ("cuda", True)
    default = WorkerSpec("sqlite:///s.db", str(tmp_path)).command("g1", 0, 1, {"assignment": {}})
    assert "--device" not in default and "--amp" not in default  # auto: the command line of before
    with pytest.raises(ConfigError, match="worker_device"):
        parse_deployment({"stream_url": "sqlite:///s.db", "worker_device": "gpu"})


def test_the_worker_reads_the_device_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("KALE_WORKER_DEVICE", "cpu")
    monkeypatch.setenv("KALE_WORKER_AMP", "1")
    args = build_arg_parser().parse_args(["--stream", "s", "--assignment", "{}", "--worker-id", "0",
                                          "--checkpoint-dir", "ck"])
    assert (args.device, args.amp) == ("cpu", True)


def test_the_gpu_benchmark_says_plainly_when_there_is_no_gpu(no_gpu, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)  # restored after the benchmark
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py"
    spec = importlib.util.spec_from_file_location("gpu_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "gpu.json"
    assert bench.main(["--json", str(out), "--steps", "1", "--cpu-steps", "2", "--batch-size", "64"]) == 0
    doc = json.loads(out.read_text())
    assert doc["gpu"] is None and "sees no CUDA GPU" in doc["reason"]
    assert doc["cpu"]["samples_per_s"] > 0 and doc["cpu"]["device"] == "cpu"  # the CPU comparison line
    assert "no GPU:" in capsys.readouterr().out
