"""``gpu_check.md``: the GPU check's own report draws each part with the GPU page's renderer
(``benchmarks/gpu/render.py``), so the file a check writes and the results page show the same tables; a failed or
skipped step says so, and a dry run on a CPU (no GPU memory, skipped CUDA tests) draws too."""

from __future__ import annotations

import copy
import importlib
import importlib.util
from pathlib import Path

import pytest
from test_reproduce import GPU_CHECK

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu():
    """``benchmarks.gpu.gpu_check`` and ``benchmarks.gpu.render``, imported as the command imports them."""
    spec = importlib.util.spec_from_file_location("reproduce_for_gpu_report", REPO / "benchmarks" / "reproduce.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return importlib.import_module("benchmarks.gpu.gpu_check"), importlib.import_module("benchmarks.gpu.render")


def _check(**steps):
    result = copy.deepcopy(GPU_CHECK)
    result["steps"].update(steps)
    result["ok"] = all(s["ok"] for s in result["steps"].values())
    return result


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of a markdown text."""
    body = text.split(f"## {heading}\n\n", 1)[1]
    return body.split("\n## ", 1)[0].strip()


def test_every_part_is_the_page_table(gpu):
    gpu_check, render = gpu
    text = gpu_check.to_markdown(_check())
    assert text.startswith("# GPU check — NVIDIA H100 80GB HBM3\n") and "status **OK**" in text
    for part, heading in gpu_check.SECTIONS:
        if render.GPU_CHECK_PARTS[part] not in GPU_CHECK["steps"]:
            assert _section(text, heading) == "not run in this check"
            continue
        page = render.render_gpu_check(f"gpu-{part}", {"part": part, "title": "t"}, [GPU_CHECK])
        table = page[2:]  # the caption, a blank line, the table
        assert table[0].startswith("| ") and table[1].startswith("|---")
        assert _section(text, heading).endswith("\n".join(table)), part
    assert "| 256 px image | float32 | 586.9 img | 618.1 img | 0.95 | 795 |" in text


def test_a_failed_step_shows_its_error_and_a_failed_budget_its_table(gpu):
    gpu_check, _ = gpu
    text = gpu_check.to_markdown(_check(
        simulator_round={"ok": False, "error": "RuntimeError: timeout"},
        paper_budget={"ok": False, "error": "RuntimeError: the paper budget did not finish within 60 s", "seconds": 61},
        engine_throughput_3d={"ok": False, "error": "RuntimeError: out of memory"}))
    assert "status **FAILED**" in text
    assert _section(text, "One FedAvg job, 4 sites on one device (NVFlare simulator)") == "**failed**: RuntimeError: timeout"
    budget = _section(text, "The paper budget on one GPU")
    assert budget.startswith("The paper budget (200 rounds,") and "`fedseg bench --family polyp" in budget
    assert budget.endswith("| did not finish | the paper budget did not finish within 60 s |")
    engine = _section(text, "Engine vs plain PyTorch loop (training, in-memory batches: 2-D images, then 3-D patches)")
    assert "| 256 px image |" in engine and "voxel patch" not in engine
    assert engine.endswith("3-D patches: **failed**: RuntimeError: out of memory")


def test_a_dry_run_on_a_cpu_draws(gpu):
    """No GPU memory to report (None) and CUDA tests skipped with their reasons (a '|' in one kept in its cell)."""
    gpu_check, _ = gpu
    cpu_engine = [{"image_size": 32, "precision": "bfloat16", "device": "cpu", "engine_images_per_s": 10.0,
                   "plain_images_per_s": 12.5, "ratio_engine_to_plain": 0.8, "peak_gpu_memory_mib": None}]
    tests = copy.deepcopy(GPU_CHECK["steps"]["cuda_tests"])
    tests["result"]["cases"][0].update(outcome="skipped", detail="no CUDA device | CPU only")
    ranks = copy.deepcopy(GPU_CHECK["steps"]["site_ranks"])
    ranks["result"]["runs"][0].update(backend="gloo", site_compute_s=None, train_loss=None, steps=None)
    text = gpu_check.to_markdown(_check(
        engine_throughput={"ok": True, "result": cpu_engine}, engine_throughput_3d={"ok": True, "result": []},
        cuda_tests=tests, site_ranks=ranks))
    assert "| 32 px image | bfloat16 | 10.0 img | 12.5 img | 0.80 | - |" in text
    assert "| test | outcome | seconds | detail |" in text
    assert r"| `test_a` | skipped | 1.1 | no CUDA device \| CPU only |" in text and "| `test_b` | passed | 33.1 |  |" in text
    assert "| 1 | gloo | 69.0 | 41.64 | - | - | - | 0.690 |" in text
