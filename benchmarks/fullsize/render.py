"""Renderer of the full-size page: ``benchmarks/fullsize/fullsize_ct.py``'s JSON."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from benchmarks.core.registry import ReproduceError
from benchmarks.core.renderers import remake, stale
from fedseg.markdown import markdown_table


def render_fullsize_ct(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/fullsize/fullsize_ct.py``'s JSON, one part (``table["part"]``): ``loaders`` (one row per data-path
    configuration: decoded size against RAM, peak memory against the stated bound, epoch times, cache hit rate) or
    ``infer`` (``fedseg infer`` on one full-size volume: seconds, peak memory, the mask's geometry)."""
    from benchmarks.core.tables import caption

    data = outputs[0]
    vol, part = data["volumes"], table.get("part")
    size = "×".join(map(str, vol["shape"]))
    spacing = "×".join(f"{v:g}" for v in vol["spacing"])
    target = "×".join(f"{v:g}" for v in vol["target_spacing"])
    head = (f"CT-like volumes of {size} voxels, int16 HU at {spacing} mm ({vol['raw_mb']:.0f} MB decoded, "
            f"{vol['file_mb']:.0f} MB .nii.gz), resampled to {target} mm")
    if part == "loaders":
        loaders = data["loaders"]
        rows = []
        for r in loaders["rows"]:
            later = "-" if r["steady_epoch_s"] is None else f"{r['steady_epoch_s']:.0f}"
            rows.append([str(r["configuration"]), str(r["volumes"]), f"{r['decoded_mb'] / 1024:.2f} / {loaders['ram_mb'] / 1024:.0f}",
                         f"{r['cached_in_memory']} ({r['cache_mb']:.0f} MB)", str(r["num_workers"]), str(r["peak_rss_mb"]),
                         str(r["peak_tree_pss_mb"]), f"{r['bound_main_mb']} / {r['bound_tree_mb']}",
                         "yes" if r["within_bound"] else "NO", f"{r['first_epoch_s']:.0f}", later, f"{r['data_s']:.0f}",
                         f"{r['hit_rate']:.2f}"])
        lines = markdown_table(["data", "volumes", "decoded / RAM (GB)", "held in memory", "workers",
                                "peak RSS, training process (MB)", "peak PSS, site's processes (MB)",
                                "stated bound, process / all (MB)", "within", "first epoch (s)", "later epochs (s)",
                                "data time (s)", "cache hit rate"], rows)
        net = data["network"]
        d = loaders["decode"]
        note = (f"{head}; cache_max_mb {loaders['cache_max_mb']} (holds the first 3 training items, image + label in "
                f"float32 on the resampled grid); {data['epochs']} epochs, one `SegEngine.train` call each, a fresh process "
                f"per row. The network is small on purpose (3-D U-Net {net['channels']}, {'×'.join(map(str, net['patch_size']))} "
                f"patches, batch {net['batch_size']} × {net['patch_samples']}): the rows differ only in the data path. "
                f"Decoding one volume takes {d['decode_s']:.0f} s and {d['decode_peak_mb']} MB at peak. Data time = seconds spent "
                "in the dataset over the run (all processes); hit rate = item accesses served from the memory or disk cache. "
                "Bound: the peak of the same site with its data within the budget (first row: process, cache and the "
                "larger of one decode and one training iteration) plus one volume being decoded; each worker adds a "
                f"process of the same base size decoding one volume plus its prefetched batches ({loaders['prefetch_mb']:.0f} MB).")
    elif part == "infer":
        r = data["infer"]
        lines = markdown_table(
            ["volume", "window", "device / output assembled on", "seconds", "peak RSS (MB)", "peak GPU memory (MiB)",
             "mask in the input's shape / affine"],
            [[f"{'×'.join(map(str, r['shape']))} at {'×'.join(f'{v:g}' for v in r['spacing'])} mm",
              f"{'×'.join(map(str, r['window']))} × {r['sw_batch_size']}", f"{r['device']} / {r['stitch_device']}",
              f"{r['seconds']:.0f}", str(r["peak_rss_mb"]), "-" if r["peak_gpu_mib"] is None else str(r["peak_gpu_mib"]),
              f"{'yes' if r['mask_shape_ok'] else 'NO'} / {'yes' if r['mask_affine_ok'] else 'NO'}"]])
        note = (f"{head}; `fedseg infer --stitch-device {r['stitch_device']}` (sliding window, windows on the network's "
                "device, the scores assembled on the CPU), the network of the loader table with its initial weights "
                "(memory and time do not depend on them); seconds and peak RSS of the whole call (reading, resampling, "
                "windows, inverting to the input's grid, writing the mask) in a fresh process.")
    else:
        raise ReproduceError(f"table {table_id!r}: 'part' must be loaders or infer, got {part!r}")
    return [caption(data, table["title"], f"{note} {remake(table_id)}{stale(data)}"), "", *lines]
