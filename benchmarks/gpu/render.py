"""Renderers of the GPU page: ``benchmarks/gpu/gpu_check.py``'s and ``engine_throughput.py``'s JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from benchmarks.core.registry import ReproduceError
from benchmarks.core.renderers import other_runs, remake, stale
from fedseg.markdown import markdown_cell, markdown_table


def render_engine_throughput(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/gpu/engine_throughput.py``'s JSON (one or several runs): per run and data mode, median images/s of
    the engine and of the plain loop, their ratio, the A/A control ratio and CPU seconds per call."""
    from benchmarks.core.tables import caption

    rows = []
    for data in outputs:
        s = data["settings"]
        for r in data["results"]:
            e, p = r["paths"]["engine"], r["paths"]["plain"]
            control = "-" if r.get("control_ratio_images_per_s") is None else f"{r['control_ratio_images_per_s']:.2f}"
            patch = "×".join(map(str, r["patch"])) if r.get("patch") else f"{s.get('image_size')} px"
            rows.append([s["family"], s.get("spatial_mode") or "-", patch, str(s["batch_size"]), r["mode"],
                         f"{e['median_images_per_s']:.2f}", f"{p['median_images_per_s']:.2f}", f"{r['ratio_images_per_s']:.2f}",
                         control, f"{e['median_cpu_s']:.2f} / {p['median_cpu_s']:.2f}"])
    lines = markdown_table(["family", "spatial mode", "patch", "batch", "data", "engine img/s", "plain img/s",
                            "engine / plain", "A/A control / plain", "CPU s per call engine / plain"], rows)
    first = outputs[0]["settings"]
    epochs = f"{first['epochs_per_call']} epoch" + ("" if first["epochs_per_call"] == 1 else "s")
    note = (f"Median over {first['repeats']} interleaved timed calls of {epochs} each "
            "(after one warm-up call); memory = batches held in memory (the training loop only), loader = the engine's "
            "real DataLoader; A/A control = a second identical plain loop (the noise floor)."
            + other_runs(table, outputs) + f" {remake(table_id)}" + "".join(stale(o) for o in outputs))
    return [caption(outputs[0], table["title"], note), "", *lines]


#: the tables a GPU check can be drawn as (``TABLES[...]["part"]``), each with the step of the check it draws
GPU_CHECK_PARTS = {"tests": "cuda_tests", "engine": "engine_throughput", "simulator": "simulator_round",
                   "site-ranks": "site_ranks", "networks-96": "volume_networks_96", "round-limit": "round_limit",
                   "paper-budget": "paper_budget"}


def _cell(value: Any, spec: str = "") -> str:
    """``value`` formatted by ``spec``, ``-`` where it was not measured (None: no GPU memory on a CPU)."""
    return "-" if value is None else format(value, spec)


def gpu_check_part(steps: Mapping[str, Any], part: str) -> Tuple[List[str], str]:
    """One part of a GPU check's ``steps`` (:data:`GPU_CHECK_PARTS`): its markdown table and a note saying what the
    table shows: ``tests`` (each CUDA test and its outcome; the reason of any that did not pass), ``engine`` (engine vs
    plain loop, 2-D images and 3-D patches), ``simulator`` (the FedAvg rounds), ``site-ranks`` (a site as N DDP
    ranks), ``networks-96`` (the 3-D paper-profile networks at 96^3), ``round-limit`` (a round against the device's
    pace) or ``paper-budget`` (the paper budget's benches, or what happened where they did not finish).

    Raises:
        ReproduceError: an unknown part, or the part's step missing from ``steps`` or failed.
    """
    if part not in GPU_CHECK_PARTS:
        raise ReproduceError(f"'part' must be one of {', '.join(GPU_CHECK_PARTS)}, got {part!r}")

    def result(step: str) -> Any:
        if step not in steps:
            raise ReproduceError(f"the GPU check has no step {step!r} (steps: {sorted(steps)})")
        if not steps[step].get("ok"):
            raise ReproduceError(f"step {step!r} of the GPU check failed: {steps[step].get('error')}")
        return steps[step]["result"]

    if part == "tests":
        res = result("cuda_tests")
        counts, cases = res["counts"], res["cases"]
        detail = any(c.get("detail") for c in cases)  # why a test was skipped or failed, where one was
        lines = markdown_table(["test", "outcome", "seconds"] + (["detail"] if detail else []), [
            [f"`{c['test'].split('::')[-1]}`", c["outcome"], f"{c['seconds']:.1f}"]
            + ([markdown_cell(c.get("detail") or "")] if detail else []) for c in cases])
        note = (f"`{' '.join(['pytest'] + res['command'].split(' pytest ', 1)[-1].split())}`: " if " pytest " in res["command"] else "")
        note += ", ".join(f"{n} {k}" for k, n in counts.items()) + f" ({steps['cuda_tests'].get('seconds', 0):.0f} s)."
    elif part == "engine":
        rows = [[f"{r['image_size']} px image", r["precision"], f"{r['engine_images_per_s']:.1f} img",
                 f"{r['plain_images_per_s']:.1f} img", f"{r['ratio_engine_to_plain']:.2f}", _cell(r["peak_gpu_memory_mib"])]
                for r in result("engine_throughput")]
        rows += [[f"{'×'.join(map(str, r['patch']))} voxel patch", r["precision"],
                  f"{r['engine_volumes_per_s']:.1f} vol ({r['engine_mvoxels_per_s']:.1f} Mvoxel)",
                  f"{r['plain_volumes_per_s']:.1f} vol", f"{r['ratio_engine_to_plain']:.2f}", _cell(r["peak_gpu_memory_mib"])]
                 for r in (steps.get("engine_throughput_3d") or {}).get("result") or []]
        lines = markdown_table(["input", "precision", "engine per s", "plain per s", "engine / plain",
                                "peak GPU memory (MiB)"], rows)
        note = ("Training throughput on in-memory batches, same model, loss, optimiser and batches for both loops; "
                "float16 = autocast with a gradient scaler.")
    elif part == "site-ranks":
        res = result("site_ranks")
        lines = markdown_table(
            ["ranks", "backend", "whole job (s)", "round wall (s)", "site compute (s)", "train loss", "steps", "test Dice"],
            [[str(r["ranks"]), r["backend"], f"{r['job_total_s']:.1f}", f"{r['per_round'][0]['wall']:.2f}",
              _cell(r["site_compute_s"], ".2f"), _cell(r["train_loss"], ".4f"), _cell(r["steps"], "g"),
              f"{r['test_dice']:.3f}"] for r in res["runs"]])
        note = (f"One FedAvg round, one site, profile `{res['profile']}`, the site's Client API script under `torchrun` "
                f"(`site_executor=\"client_api_torchrun\"`); {res['gpus']} GPU(s) on the machine.")
    elif part == "networks-96":
        res = result("volume_networks_96")
        lines = markdown_table(
            ["network", "parameters (M)", "patch × batch", "precision", "step (s)", "Mvoxel/s", "peak GPU memory (MiB)"],
            [[r["network"], str(r["parameters_m"]), f"{'×'.join(map(str, r['patch']))} × {r['batch']}", r["precision"],
              f"{r['step_s']:.3f}", f"{r['mvoxels_per_s']:.1f}", _cell(r["peak_gpu_memory_mib"])] for r in res["rows"]])
        note = ("The volume `paper` profile's networks on random in-memory patches (no data loading): DiceCE loss, "
                "Adam, median training step after a warm-up; float16 = autocast with a gradient scaler.")
    elif part == "round-limit":
        from benchmarks.cost.render import ROUND_LIMIT_NOTE, round_limit_rows

        res = result("round_limit")
        lines = round_limit_rows(res)
        note = f"`{res['command']}`, {len(res['sites'])} sites. {ROUND_LIMIT_NOTE}"
    elif part == "paper-budget" and not (steps.get("paper_budget") or {}).get("ok", True):
        from benchmarks.gpu.paper_budget import PAPER_BUDGET_ROUNDS, paper_budget_commands

        failed = steps["paper_budget"]
        lines = markdown_table(["outcome", "what happened"],
                               [["did not finish", markdown_cell(failed["error"].split(": ", 1)[-1])]])
        commands = [" ".join(c) for c in paper_budget_commands(Path("OUT"), False).values()]
        note = (f"The paper budget ({PAPER_BUDGET_ROUNDS} rounds, the two benches at once, the CUDA tests beside them at "
                f"first) in what the check had left ({failed.get('seconds', 0):.0f} s). " + " ".join(f"`{c}`" for c in commands))
    elif part == "paper-budget":
        res = result("paper_budget")
        lines = markdown_table(["bench", "approach", "median round (s)", "round vs FedAvg", "whole run (s)"], [
            [bench, label, _cell(t.get("median_round_wall"), ".2f"), _cell(t.get("round_wall_ratio_to_fedavg"), ".2f")
             + ("" if t.get("round_wall_ratio_to_fedavg") is None else "x"), f"{t.get('wall_s_total') or 0:.0f}"]
            for bench, b in res["benches"].items() for label, t in b["timing"].items()])
        note = (f"{res['rounds']} rounds, both benches at once on the one GPU: {res['wall_s']:.0f} s in all; settings "
                f"{', '.join(res['sets']) or 'none'} (bfloat16 autocast is a speed option the papers did not use). "
                + " ".join(f"`{c}`" for c in res["commands"].values()))
    else:
        res = result("simulator_round")
        lines = markdown_table(
            ["round", "wall (s)", "max site compute (s)", "sum site compute (s)", "overhead = wall - max (s)",
             "upload, all sites (MB)"],
            [[str(r["round"]), f"{r['wall']:.2f}", f"{r['max_compute']:.2f}", f"{r['sum_compute']:.2f}",
              f"{r['overhead']:.2f}", f"{r['bytes_up'] / 1e6:.1f}"] for r in res["per_round"]])
        note = (f"`{res['command']}`; profile `{res['profile']}`, {res['sites']} sites ({res['sites_on_cuda']} on CUDA), "
                f"whole job {res['job_total_s']:.1f} s, final mean Dice {res['final_mean_dice']:.3f}; round 0 includes "
                "each site's set-up (engine, data cache, CUDA context).")
    return lines, note


def render_gpu_check(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/gpu/gpu_check.py``'s JSON, one of its parts (``table["part"]``, :func:`gpu_check_part`), under a
    caption naming the device."""
    from benchmarks.core.tables import caption

    data = outputs[0]
    steps, device = data.get("steps") or {}, data.get("device") or {}
    try:
        lines, note = gpu_check_part(steps, table.get("part"))
    except ReproduceError as e:
        raise ReproduceError(f"table {table_id!r}: {e}") from None
    machine = {**device, "device": f"{device.get('device', '?')}, {device.get('gpu_memory_gib', '?')} GiB, "
                                   f"CUDA {device.get('cuda_version', '?')}"}
    head = {"date": data.get("date"), "machine": machine, **({"code_version": data["code_version"]}
                                                             if "code_version" in data else {})}
    return [caption(head, table["title"], f"{note} Re-make: `python benchmarks/reproduce.py {table_id} --run` "
                                          f"(on a CUDA machine).{stale(data)}"), "", *lines]
