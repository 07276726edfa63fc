"""Renderers of the GPU page: ``benchmarks/gpu/gpu_check.py``'s and ``engine_throughput.py``'s JSON."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from benchmarks.core.registry import ReproduceError
from benchmarks.core.renderers import other_runs, remake, stale


def render_engine_throughput(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/gpu/engine_throughput.py``'s JSON (one or several runs): per run and data mode, median images/s of
    the engine and of the plain loop, their ratio, the A/A control ratio and CPU seconds per call."""
    from fedseg.bench.tables import caption

    lines = ["| family | spatial mode | patch | batch | data | engine img/s | plain img/s | engine / plain | "
             "A/A control / plain | CPU s per call engine / plain |", "|---|---|---|---|---|---|---|---|---|---|"]
    for data in outputs:
        s = data["settings"]
        for r in data["results"]:
            e, p = r["paths"]["engine"], r["paths"]["plain"]
            control = "-" if r.get("control_ratio_images_per_s") is None else f"{r['control_ratio_images_per_s']:.2f}"
            patch = "×".join(map(str, r["patch"])) if r.get("patch") else f"{s.get('image_size')} px"
            lines.append(f"| {s['family']} | {s.get('spatial_mode') or '-'} | {patch} | {s['batch_size']} | {r['mode']} | "
                         f"{e['median_images_per_s']:.2f} | {p['median_images_per_s']:.2f} | {r['ratio_images_per_s']:.2f} | "
                         f"{control} | {e['median_cpu_s']:.2f} / {p['median_cpu_s']:.2f} |")
    first = outputs[0]["settings"]
    epochs = f"{first['epochs_per_call']} epoch" + ("" if first["epochs_per_call"] == 1 else "s")
    note = (f"Median over {first['repeats']} interleaved timed calls of {epochs} each "
            "(after one warm-up call); memory = batches held in memory (the training loop only), loader = the engine's "
            "real DataLoader; A/A control = a second identical plain loop (the noise floor)."
            + other_runs(table, outputs) + f" {remake(table_id)}" + "".join(stale(o) for o in outputs))
    return [caption(outputs[0], table["title"], note), "", *lines]


#: the tables a GPU check can be drawn as (``TABLES[...]["part"]``)
GPU_CHECK_PARTS = ("tests", "engine", "simulator", "site-ranks", "networks-96")


def render_gpu_check(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/gpu/gpu_check.py``'s JSON, one of its parts (``table["part"]``): ``tests`` (each CUDA test and its
    outcome), ``engine`` (engine vs plain loop, 2-D images and 3-D patches), ``simulator`` (the FedAvg rounds),
    ``site-ranks`` (a site as N DDP ranks) or ``networks-96`` (the 3-D paper-profile networks at 96^3)."""
    from fedseg.bench.tables import caption

    data = outputs[0]
    steps, device = data.get("steps") or {}, data.get("device") or {}
    part = table.get("part")
    if part not in GPU_CHECK_PARTS:
        raise ReproduceError(f"table {table_id!r}: 'part' must be one of {', '.join(GPU_CHECK_PARTS)}, got {part!r}")

    def result(step: str) -> Any:
        if step not in steps:
            raise ReproduceError(f"table {table_id!r}: the GPU check has no step {step!r} (steps: {sorted(steps)})")
        if not steps[step].get("ok"):
            raise ReproduceError(f"table {table_id!r}: step {step!r} of the GPU check failed: {steps[step].get('error')}")
        return steps[step]["result"]

    if part == "tests":
        res = result("cuda_tests")
        counts = res["counts"]
        lines = ["| test | outcome | seconds |", "|---|---|---|"]
        lines += [f"| `{c['test'].split('::')[-1]}` | {c['outcome']} | {c['seconds']:.1f} |" for c in res["cases"]]
        note = (f"`{' '.join(['pytest'] + res['command'].split(' pytest ', 1)[-1].split())}`: " if " pytest " in res["command"] else "")
        note += ", ".join(f"{n} {k}" for k, n in counts.items()) + f" ({steps['cuda_tests'].get('seconds', 0):.0f} s)."
    elif part == "engine":
        lines = ["| input | precision | engine per s | plain per s | engine / plain | peak GPU memory (MiB) |",
                 "|---|---|---|---|---|---|"]
        for r in result("engine_throughput"):
            lines.append(f"| {r['image_size']} px image | {r['precision']} | {r['engine_images_per_s']:.1f} img | "
                         f"{r['plain_images_per_s']:.1f} img | {r['ratio_engine_to_plain']:.2f} | {r['peak_gpu_memory_mib']} |")
        for r in (steps.get("engine_throughput_3d") or {}).get("result") or []:
            lines.append(f"| {'×'.join(map(str, r['patch']))} voxel patch | {r['precision']} | "
                         f"{r['engine_volumes_per_s']:.1f} vol ({r['engine_mvoxels_per_s']:.1f} Mvoxel) | "
                         f"{r['plain_volumes_per_s']:.1f} vol | {r['ratio_engine_to_plain']:.2f} | {r['peak_gpu_memory_mib']} |")
        note = ("Training throughput on in-memory batches, same model, loss, optimiser and batches for both loops; "
                "float16 = autocast with a gradient scaler.")
    elif part == "site-ranks":
        res = result("site_ranks")
        lines = ["| ranks | backend | whole job (s) | round wall (s) | site compute (s) | train loss | steps | test Dice |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in res["runs"]:
            lines.append(f"| {r['ranks']} | {r['backend']} | {r['job_total_s']:.1f} | {r['per_round'][0]['wall']:.2f} | "
                         f"{r['site_compute_s']:.2f} | {r['train_loss']:.4f} | {r['steps']:g} | {r['test_dice']:.3f} |")
        note = (f"One FedAvg round, one site, profile `{res['profile']}`, the site's Client API script under `torchrun` "
                f"(`site_executor=\"client_api_torchrun\"`); {res['gpus']} GPU(s) on the machine.")
    elif part == "networks-96":
        res = result("volume_networks_96")
        lines = ["| network | parameters (M) | patch × batch | precision | step (s) | Mvoxel/s | peak GPU memory (MiB) |",
                 "|---|---|---|---|---|---|---|"]
        for r in res["rows"]:
            lines.append(f"| {r['network']} | {r['parameters_m']} | {'×'.join(map(str, r['patch']))} × {r['batch']} | "
                         f"{r['precision']} | {r['step_s']:.3f} | {r['mvoxels_per_s']:.1f} | {r['peak_gpu_memory_mib']} |")
        note = ("The volume `paper` profile's networks on random in-memory patches (no data loading): DiceCE loss, "
                "Adam, median training step after a warm-up; float16 = autocast with a gradient scaler.")
    else:
        res = result("simulator_round")
        lines = ["| round | wall (s) | max site compute (s) | sum site compute (s) | overhead = wall - max (s) | "
                 "upload, all sites (MB) |", "|---|---|---|---|---|---|"]
        for r in res["per_round"]:
            lines.append(f"| {r['round']} | {r['wall']:.2f} | {r['max_compute']:.2f} | {r['sum_compute']:.2f} | "
                         f"{r['overhead']:.2f} | {r['bytes_up'] / 1e6:.1f} |")
        note = (f"`{res['command']}`; profile `{res['profile']}`, {res['sites']} sites ({res['sites_on_cuda']} on CUDA), "
                f"whole job {res['job_total_s']:.1f} s, final mean Dice {res['final_mean_dice']:.3f}; round 0 includes "
                "each site's set-up (engine, data cache, CUDA context).")
    machine = {**device, "device": f"{device.get('device', '?')}, {device.get('gpu_memory_gib', '?')} GiB, "
                                   f"CUDA {device.get('cuda_version', '?')}"}
    head = {"date": data.get("date"), "machine": machine, **({"code_version": data["code_version"]}
                                                             if "code_version" in data else {})}
    return [caption(head, table["title"], f"{note} Re-make: `python benchmarks/reproduce.py {table_id} --run` "
                                          f"(on a CUDA machine).{stale(data)}"), "", *lines]
