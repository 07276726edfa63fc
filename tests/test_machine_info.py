"""The machine a record was measured on: one collector (``fedseg.bench.simulator.machine_info``) for ``fedseg bench``
and every benchmark script, each script adding what only it knows (the device it measured, torch threads), and one
caption text (``benchmarks.core.tables.machine_text``) that draws old records as before."""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
from pathlib import Path

import pytest
import torch

from fedseg.bench.simulator import load_average, machine_info

REPO = Path(__file__).resolve().parents[1]
#: the fields ``fedseg bench`` has written into every ``results.json`` (committed records hold them)
BENCH_FIELDS = {"platform", "cpu_count", "python", "torch", "gpus", "loadavg_at_start"}


@pytest.fixture(scope="module")
def benchmarks_package():
    """``benchmarks`` as the command imports it (``reproduce.py`` puts the repository root first on the path)."""
    spec = importlib.util.spec_from_file_location("reproduce_for_machine_test", REPO / "benchmarks" / "reproduce.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return importlib.import_module("benchmarks")


def test_machine_info_names_the_machine_and_its_load():
    info = machine_info()
    assert set(info) == BENCH_FIELDS
    assert info["cpu_count"] == os.cpu_count() and info["torch"] == torch.__version__
    assert info["platform"] == platform.platform() and info["python"] == platform.python_version()
    expected_gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    assert info["gpus"] == expected_gpus
    load = load_average()
    assert len(info["loadavg_at_start"]) == len(load) == 3 and all(v >= 0 for v in load)


def test_machine_text_draws_each_kind_of_record(benchmarks_package):
    from benchmarks.core.tables import machine_text

    bench = {"platform": "Linux", "cpu_count": 2, "python": "3.11.7", "torch": "2.13.0+cpu", "gpus": [],
             "loadavg_at_start": [2.46, 2.0, 1.9]}
    assert machine_text(bench) == "2 CPUs, no GPU, torch 2.13.0+cpu, load 2.5"
    assert machine_text({**bench, "gpus": ["NVIDIA H200"]}) == "2 CPUs, NVIDIA H200, torch 2.13.0+cpu, load 2.5"
    # a script's record (before it named the machine's GPUs too): the device it measured
    script = {"cpu_count": 16, "torch": "2.11.0", "device": "NVIDIA H200, 139.8 GiB, CUDA 13.0"}
    assert machine_text(script) == "16 CPUs, device NVIDIA H200, 139.8 GiB, CUDA 13.0, torch 2.11.0"
    # the same script now: the machine's GPUs recorded beside the device, which the caption still names
    assert machine_text({**script, "gpus": ["NVIDIA H200"], "loadavg_at_start": [0.5, 0, 0], "torch_threads": 1}) == (
        "16 CPUs, device NVIDIA H200, 139.8 GiB, CUDA 13.0, torch 2.11.0, 1 torch thread, load 0.5")
    assert machine_text(None) == "not recorded"


def test_scripts_record_the_machine_info_and_their_own_fields(benchmarks_package):
    """The round-limit script and the GPU check keep every field their committed records have, from ``machine_info``."""
    from benchmarks.core.tables import machine_text
    from benchmarks.cost.round_limit import device_info as round_limit_device
    from benchmarks.gpu.gpu_check import device_info as gpu_check_device

    limit = round_limit_device(torch.device("cpu"))
    assert set(limit) == BENCH_FIELDS | {"device"} and limit["device"].startswith("CPU (")
    assert limit["device"].endswith(f", {os.cpu_count()} cores)")
    assert machine_text(limit).startswith(f"{os.cpu_count()} CPU") and f"device {limit['device']}" in machine_text(limit)
    check = gpu_check_device()
    # the committed GPU checks' device fields (cuda_version, gpu_memory_gib, gpu_count, cudnn on a CUDA machine)
    assert {"platform", "python", "torch", "cpu_count", "cuda", "device"} <= set(check) and BENCH_FIELDS <= set(check)
    assert check["cuda"] == torch.cuda.is_available()
