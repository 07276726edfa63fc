"""Federated statistics of a federation's images and labels: NVFlare's ``FedStatsRecipe`` with the suite's
``Statistics`` component (:class:`fedseg.fl.site_statistics.SiteImageStatistics`) at every site, run in NVFlare's
simulator.

NVFlare's ``StatsJob`` puts its privacy filter on every site's result: ``MinCountCleanser`` (a feature with fewer
records than ``min_count`` is not sent: images for the per-image features, pixels for the intensity ones; a site with
fewer images than ``min_count`` does not offer its intensity features at all, ``SiteImageStatistics.min_images``),
``AddNoiseToMinMax`` (min/max leave the site with noise) and ``HistogramBinsCleanser`` (a histogram with as many bins
as ``max_bins_percent`` % of its records is not sent). The server writes NVFlare's JSON of every site's and the
global statistics; :mod:`fedseg.fl.site_differences` reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from fedseg.fl.site_differences import JOB_STATISTICS
from fedseg.fl.site_statistics import (
    DEFAULT_INTENSITY_BINS,
    DEFAULT_INTENSITY_RANGE,
    FG_FRACTION,
    INTENSITY,
    OUTSIDE,
    PRESENT,
    SiteImageStatistics,
)

#: where NVFlare's statistics writer puts its JSON, relative to the server's job folder
STATS_OUTPUT = "statistics/image_statistics.json"
#: bins of the per-image histograms (foreground fraction; image size over the sites' noisy min/max)
DEFAULT_FRACTION_BINS = 10
#: channels the statistic config names (RGB(A) at most; a site's features that the config does not name get
#: the default bins over the sites' noisy min/max)
MAX_CHANNELS = 4


def statistic_configs(class_names: Sequence[str], intensity_bins: int = DEFAULT_INTENSITY_BINS,
                      intensity_range: Optional[Tuple[float, float]] = DEFAULT_INTENSITY_RANGE,
                      fraction_bins: int = DEFAULT_FRACTION_BINS) -> Dict[str, Any]:
    """NVFlare's ``statistic_configs``: count, sum, mean, stddev, min/max and histograms; the intensity histogram on
    the shared ``intensity_bins`` over ``intensity_range`` (None: over the sites' noisy min/max), per-class ones over
    [0, 1]; the image sizes (and spacings) over the sites' noisy min/max; ``class_names[0]`` is the background."""
    hist: Dict[str, Dict[str, Any]] = {"*": {"bins": fraction_bins}}
    for k in range(MAX_CHANNELS):
        hist[f"{INTENSITY}{k}"] = {"bins": intensity_bins}
        if intensity_range is not None:
            hist[f"{INTENSITY}{k}"]["range"] = [float(intensity_range[0]), float(intensity_range[1])]
        hist[f"{OUTSIDE}{k}"] = {"bins": 2, "range": [0.0, 1.0]}
    for name in class_names[1:]:
        hist[f"{FG_FRACTION}{name}"] = {"bins": fraction_bins, "range": [0.0, 1.0]}
        hist[f"{PRESENT}{name}"] = {"bins": 2, "range": [0.0, 1.0]}
    return {name: hist if name == "histogram" else {} for name in JOB_STATISTICS}


def fedstats_recipe(sites: Sequence[str], class_names: Sequence[str], site_datalists: Optional[str] = None,
                    split: str = "training", intensity_bins: int = DEFAULT_INTENSITY_BINS,
                    intensity_range: Optional[Tuple[float, float]] = DEFAULT_INTENSITY_RANGE,
                    fraction_bins: int = DEFAULT_FRACTION_BINS,
                    min_count: int = 10, max_bins_percent: float = 10, min_noise_level: float = 0.1,
                    max_noise_level: float = 0.3, data_family: str = "polyp", name: str = "fedstats"):
    """NVFlare's ``FedStatsRecipe`` over ``sites`` with :class:`SiteImageStatistics` at each; privacy settings are
    NVFlare's (defaults too)."""
    from nvflare.recipe.fedstats import FedStatsRecipe

    generator = SiteImageStatistics(site_datalists=site_datalists, split=split, intensity_bins=intensity_bins,
                                    intensity_range=list(intensity_range) if intensity_range is not None else None,
                                    data_family=data_family, min_images=min_count)
    recipe = FedStatsRecipe(
        name=name, stats_output_path=STATS_OUTPUT, sites=list(sites),
        statistic_configs=statistic_configs(class_names, intensity_bins, intensity_range, fraction_bins),
        stats_generator=generator, min_count=min_count, min_noise_level=min_noise_level,
        max_noise_level=max_noise_level, max_bins_percent=max_bins_percent,
    )
    # configuration only: the sites run the fedseg they installed (a job that carries code is BYOC, which a
    # production site refuses); NVFlare's recipe keeps its job as ``_job`` and offers no setter
    recipe._job.set_app_packages(["fedseg"])
    return recipe


def federation_classes(mapping: Dict[str, str]) -> List[str]:
    """The class names every site's datalist declares (background first); a ValueError names the sites that differ."""
    from fedseg.data.datalist import datalist_label_space, read_datalist_json

    spaces = {}
    for site, datalist in mapping.items():
        path, data = read_datalist_json(datalist)
        spaces[site] = datalist_label_space(data, path).names
    distinct = set(spaces.values())
    if len(distinct) != 1:
        raise ValueError(f"the sites' datalists declare different classes: {spaces}")
    return list(distinct.pop())


def run_simulator(job_dir: os.PathLike, workspace: os.PathLike, sites: Sequence[str],
                  timeout: Optional[float] = None) -> Path:
    """``nvflare simulator`` on an exported statistics job (the workspace's allow list written first: the job carries
    no code); the server's statistics JSON. A RuntimeError says where the logs are when it fails."""
    from fedseg.fl.component_policy import prepare_simulator_workspace

    workspace = Path(workspace)
    for stale in workspace.rglob(Path(STATS_OUTPUT).name) if workspace.is_dir() else []:
        stale.unlink()  # an earlier run's statistics would pass for this run's
    prepare_simulator_workspace(workspace)
    cmd = ["nvflare", "simulator", str(job_dir), "-w", str(workspace), "-c", ",".join(sites), "-t", str(len(sites))]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    rc = subprocess.call(cmd, env=env, timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    found = sorted(workspace.rglob(Path(STATS_OUTPUT).name))
    if rc != 0 or not found:
        raise RuntimeError(f"the statistics job {'failed (exit ' + str(rc) + ')' if rc else 'wrote no statistics'}; "
                           f"the logs under {workspace} say why")
    return found[-1]



def default_intensity_range(mapping: Dict[str, str]) -> Optional[Tuple[float, float]]:
    """The shared intensity histogram's range for datalists ``mapping``: None (the sites' noisy min/max) where a site
    holds volumes (no fixed intensity scale), else 0 to 256 (8-bit images)."""
    from fedseg.data.datalist import read_datalist_json

    if any(read_datalist_json(p)[1].get("spatial_dims") == 3 for p in mapping.values()):
        return None
    return 0.0, 256.0


def bench_site_statistics(root: os.PathLike, mapping: Dict[str, str], source: str) -> Dict[str, Any]:
    """What ``fedseg bench`` shows of the sites' differences: ``source`` "run" runs this job over the bench's
    datalists into ``root/site_statistics`` (an earlier finished run there is read again), else it is the path of a
    ``stats.json``. Returns its path, sites, summary sentences and the bench's sites it lacks.

    Raises:
        ValueError: a ``stats.json`` that does not exist or is not one of ``fedseg stats``.
    """
    if source == "run":
        out = Path(root) / "site_statistics"
        path = out / "stats.json"
        if not path.is_file():
            run_fedstats(mapping, out, intensity_range=default_intensity_range(mapping))
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"--site-stats {source}: no such stats.json (write one with fedseg stats, or say 'run')")
    report = json.loads(path.read_text())
    if not isinstance(report, dict) or not {"sites", "summary"} <= set(report):
        raise ValueError(f"--site-stats {path}: not a stats.json of fedseg stats (no 'sites' and 'summary')")
    return {"stats": str(path.resolve()), "sites": report["sites"], "summary": report["summary"],
            "missing_sites": sorted(set(mapping) - set(report["sites"]))}


def run_fedstats(mapping: Dict[str, str], out_dir: os.PathLike, header: Optional[Dict[str, Any]] = None,
                 **options: Any) -> Dict[str, Any]:
    """Export and simulate the statistics job over ``mapping`` (``{site: datalist}``), then write ``stats.json`` and
    ``stats.md`` (:mod:`fedseg.fl.site_differences`) in ``out_dir``; returns the ``stats.json`` content.

    ``options`` go to :func:`fedstats_recipe` (split, bins, range, privacy settings); ``header`` fields (the
    command, date, code version, machine, data: what a results page's caption names) are written first."""
    from fedseg.fl.site_differences import site_report, write_report
    from fedseg.recipes.export import write_job

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("stats.json", "stats.md"):  # an earlier run's report would pass for this one's if this one fails
        (out / stale).unlink(missing_ok=True)
    index = out / "site_datalists.json"
    index.write_text(json.dumps({s: str(Path(p).resolve()) for s, p in mapping.items()}, indent=1))
    sites = list(mapping)
    recipe = fedstats_recipe(sites, federation_classes(mapping), site_datalists=str(index), **options)
    job = write_job(recipe, out / "job")
    raw = run_simulator(job, out / "workspace", sites)
    settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in options.items()}
    report = {**(header or {}), **site_report(json.loads(raw.read_text()), sites, settings)}
    write_report(report, out)
    return report
