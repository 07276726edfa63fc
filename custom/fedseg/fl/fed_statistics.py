"""Federated statistics of a federation's images and labels: NVFlare's ``FedStatsRecipe`` with the suite's
``Statistics`` component (:class:`fedseg.fl.site_statistics.SiteImageStatistics`) at every site, run in NVFlare's
simulator.

NVFlare's ``StatsJob`` puts its privacy filter on every site's result: ``MinCountCleanser`` (a feature with fewer
records than ``min_count`` is not sent: images for the per-image features, pixels for the intensity ones; a site with
fewer images than ``min_count`` does not offer its intensity features at all, ``SiteImageStatistics.min_images``),
``AddNoiseToMinMax`` (min/max leave the site with noise) and ``HistogramBinsCleanser`` (a histogram with as many bins
as ``max_bins_percent`` % of its records is not sent). The server writes NVFlare's JSON of every site's and the
global statistics; :mod:`fedseg.fl.site_differences` reads it.

A site that drops out does not stop the others' statistics: NVFlare's ``StatisticsController`` waits for every site's
answer by default, and a site whose client ended (its component raised at start) never answers. The job's
controller here ends each task ``site_wait`` seconds after ``min_sites`` sites answered (at once when every site
did), and a site that cannot read its data answers with nothing (``SiteImageStatistics``); the report names the
sites that sent nothing.
"""

from __future__ import annotations

import json
import os
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
    SITE_FAILURE,
    SiteImageStatistics,
)

#: NVFlare's name of every client site (a job whose client app goes to ``@ALL`` runs at any sites)
ALL_SITES = "@ALL"
#: where NVFlare's statistics writer puts its JSON, relative to the server's job folder
STATS_OUTPUT = "statistics/image_statistics.json"
#: bins of the per-image histograms (foreground fraction; image size over the sites' noisy min/max)
DEFAULT_FRACTION_BINS = 10
#: seconds each statistics task waits, once ``min_sites`` sites answered, for the sites that have not (a site that
#: reads its images slower than the first one by more than this counts as dropped out)
DEFAULT_SITE_WAIT = 120
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


def _image_stats_recipe(name: str, sites: Sequence[str], configs: Dict[str, Any], generator: SiteImageStatistics,
                        min_sites: int, site_wait: int, **privacy: Any):
    """NVFlare's ``FedStatsRecipe`` whose ``StatsJob`` configures its ``StatisticsController`` with ``min_clients``
    and ``wait_time_after_min_received`` (``StatsJob`` leaves them at NVFlare's defaults: wait for every site)."""
    from nvflare.app_common.workflows.statistics_controller import StatisticsController
    from nvflare.job_config.stats_job import StatsJob
    from nvflare.recipe.fedstats import FedStatsRecipe
    from nvflare.recipe.spec import Recipe

    class ImageStatsJob(StatsJob):
        def get_stats_controller(self) -> StatisticsController:
            return StatisticsController(statistic_configs=self.statistic_configs, writer_id=self.writer_id,
                                        enable_pre_run_task=False, min_clients=min_sites,
                                        wait_time_after_min_received=site_wait)

    class ImageStatsRecipe(FedStatsRecipe):
        def __init__(self):  # FedStatsRecipe's own __init__ builds NVFlare's StatsJob
            job = ImageStatsJob(name=name, statistic_configs=configs, stats_generator=generator,
                                output_path=STATS_OUTPUT, **privacy)
            job.setup_clients(list(sites))
            Recipe.__init__(self, job)

    return ImageStatsRecipe()


def fedstats_recipe(sites: Sequence[str], class_names: Sequence[str], site_datalists: Optional[str] = None,
                    split: str = "training", intensity_bins: int = DEFAULT_INTENSITY_BINS,
                    intensity_range: Optional[Tuple[float, float]] = DEFAULT_INTENSITY_RANGE,
                    fraction_bins: int = DEFAULT_FRACTION_BINS,
                    min_count: int = 10, max_bins_percent: float = 10, min_noise_level: float = 0.1,
                    max_noise_level: float = 0.3, data_family: str = "polyp", name: str = "fedstats",
                    min_sites: int = 1, site_wait: int = DEFAULT_SITE_WAIT, bundle: Optional[str] = None,
                    bundle_overrides: Optional[Dict[str, Any]] = None, site_overrides: Optional[str] = None):
    """NVFlare's ``FedStatsRecipe`` over ``sites`` with :class:`SiteImageStatistics` at each; privacy settings are
    NVFlare's (defaults too). The server writes its statistics once ``min_sites`` sites sent some; each task waits
    ``site_wait`` seconds after ``min_sites`` answers for the rest (module docstring). ``bundle``: the sites describe
    its training images as its network sees them (:func:`fedseg.fl.site_statistics.bundle_images`)."""
    generator = SiteImageStatistics(site_datalists=site_datalists, split=split, intensity_bins=intensity_bins,
                                    intensity_range=list(intensity_range) if intensity_range is not None else None,
                                    data_family=data_family, min_images=min_count, bundle=bundle,
                                    bundle_overrides=bundle_overrides or None, site_overrides=site_overrides)
    # named sites: no more than they (a job for @ALL runs at however many sites join)
    min_sites = int(min_sites) if ALL_SITES in sites else min(int(min_sites), len(sites))
    recipe = _image_stats_recipe(
        name, sites, statistic_configs(class_names, intensity_bins, intensity_range, fraction_bins), generator,
        min_sites=min_sites, site_wait=int(site_wait), min_count=min_count, min_noise_level=min_noise_level,
        max_noise_level=max_noise_level, max_bins_percent=max_bins_percent,
    )
    # configuration only: the sites run the fedseg they installed (a job that carries code is BYOC, which a
    # production site refuses); NVFlare's recipe keeps its job as ``_job`` and offers no setter
    recipe._job.set_app_packages(["fedseg"])
    return recipe


def export_fedstats_job(out_dir: os.PathLike, family: str = "polyp", **options: Any) -> Path:
    """Write the statistics job for any sites (one client app for every site, NVFlare's ``@ALL``) as
    ``out_dir/fedstats``, configuration only (``jobs/fedstats``: ``fedseg stats --export-job jobs``); returns its
    folder.

    Each site describes the datalist the suite's routes give it (``FEDSEG_DATALIST``, ``local/fedseg_site.json``),
    else built-in data of ``family``, whose classes and intensity range the statistic config names (the per-class
    histograms of other classes get the default bins). ``options`` go to :func:`fedstats_recipe`."""
    from fedseg.data.synthetic.families import family_label_space
    from fedseg.fl.site_statistics import family_intensity_range
    from fedseg.recipes.export import write_job

    options.setdefault("intensity_range", family_intensity_range(family))
    recipe = fedstats_recipe([ALL_SITES], family_label_space(family).names, data_family=family, **options)
    return write_job(recipe, out_dir)


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
                  timeout: float = 3600) -> Path:
    """``nvflare simulator`` on an exported statistics job in a fresh ``workspace`` (its allow list written first: the
    job carries no code; a site that could not start on a taken port is started again,
    :func:`fedseg.bench.simulator.run_simulator_command`); the server's statistics JSON. Its output goes to
    ``workspace/simulator.log``.

    Raises:
        RuntimeError: the job failed, wrote no statistics or ran past ``timeout`` seconds (its processes are then
            killed); one line: the sites' failure lines, where the logs are.
    """
    import subprocess

    from fedseg.bench.simulator import run_simulator_command

    workspace = Path(workspace)
    cmd = ["nvflare", "simulator", str(job_dir), "-w", str(workspace), "-c", ",".join(sites), "-t", str(len(sites))]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        done = run_simulator_command(cmd, workspace, env, timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the statistics job ran past {timeout:.0f} s and was stopped; the logs under {workspace} "
                           "say where it waited") from None
    (workspace / "simulator.log").write_text(done.stdout + done.stderr)
    found = sorted(workspace.rglob(Path(STATS_OUTPUT).name))
    if done.returncode != 0 or not found:
        failed = site_failures(workspace, sites)
        failures = "; ".join(f"{site}: {line}" for site, line in failed.items())
        what = f"failed (exit {done.returncode})" if done.returncode else "wrote no statistics"
        what = "no site sent statistics" if len(failed) == len(sites) else f"the statistics job {what}"
        raise RuntimeError(f"{what}{' (' + failures + ')' if failures else ''}; the logs under {workspace} say more")
    return found[-1]


def site_failures(workspace: os.PathLike, sites: Sequence[str]) -> Dict[str, str]:
    """``{site: why}`` of the simulated sites whose log holds the component's failure line
    (:data:`fedseg.fl.site_statistics.SITE_FAILURE`): what each could not read."""
    out = {}
    for site in sites:
        log = Path(workspace) / site / "log.txt"
        lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
        said = [line.split(SITE_FAILURE, 1)[1] for line in lines if SITE_FAILURE in line]
        if said:
            out[site] = said[0].split(": ", 1)[-1]  # the line names the site first
    return out


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
    out = _fresh_run_folder(out_dir)
    index = out / "site_datalists.json"
    index.write_text(json.dumps({s: str(Path(p).resolve()) for s, p in mapping.items()}, indent=1))
    sites = list(mapping)
    recipe = fedstats_recipe(sites, federation_classes(mapping), site_datalists=str(index), **options)
    return _simulate_and_report(recipe, sites, out, options, header)


def run_bundle_fedstats(bundle: str, site_overrides: os.PathLike, out_dir: os.PathLike,
                        bundle_overrides: Optional[Dict[str, Any]] = None, header: Optional[Dict[str, Any]] = None,
                        **options: Any) -> Dict[str, Any]:
    """:func:`run_fedstats` on a MONAI bundle: the sites are the keys of ``site_overrides`` (a JSON file ``{site:
    {config id: value}}``, ``fedseg run --bundle --site-overrides``), each describing the bundle's training images
    after the bundle's own preprocessing (without its random transforms) with ``bundle_overrides`` and its own
    values; the classes are the bundle's (``labels``, else ``num_classes``). ``options`` go to
    :func:`fedstats_recipe`; the intensity range defaults to the sites' noisy min/max (a bundle rescales its images).
    """
    from fedseg.bundle import read_bundle, read_site_overrides
    from fedseg.fl.monai_bundle_client import resolve_bundle_root
    from fedseg.fl.site_statistics import bundle_class_names

    out = _fresh_run_folder(out_dir)
    root, overrides_file = resolve_bundle_root(bundle), Path(site_overrides).resolve()
    sites = sorted(json.loads(overrides_file.read_text()))
    first = {**(bundle_overrides or {}), **read_site_overrides(overrides_file, sites[0])}
    class_names = bundle_class_names(read_bundle(root, first, initialize=False).parser)
    options.setdefault("intensity_range", None)
    recipe = fedstats_recipe(sites, class_names, bundle=str(root), bundle_overrides=bundle_overrides,
                             site_overrides=str(overrides_file), **options)
    settings = {**options, "bundle": str(root), "bundle_overrides": bundle_overrides or {},
                "site_overrides": str(overrides_file)}
    return _simulate_and_report(recipe, sites, out, settings, header)


def _fresh_run_folder(out_dir: os.PathLike) -> Path:
    """``out_dir`` resolved and created, without an earlier run's report (which would pass for this one's if this
    one fails)."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("stats.json", "stats.md"):
        (out / stale).unlink(missing_ok=True)
    return out


def _simulate_and_report(recipe, sites: Sequence[str], out: Path, settings: Dict[str, Any],
                         header: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Export ``recipe`` into ``out/job``, simulate it at ``sites`` in ``out/workspace``, write the report in ``out``."""
    from fedseg.recipes.export import write_job

    job = write_job(recipe, out / "job")
    raw = run_simulator(job, out / "workspace", sites)
    settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.items()}
    return report_statistics(raw, sites, out, settings, header)


def report_statistics(raw: os.PathLike, sites: Sequence[str], out_dir: os.PathLike,
                      settings: Optional[Dict[str, Any]] = None, header: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``stats.json``, ``stats.md`` and figures in ``out_dir`` from the server's statistics JSON ``raw`` of a job run
    at ``sites`` (the simulator's, or a POC / deployment result's ``statistics/image_statistics.json``); returns the
    ``stats.json`` content.

    Raises:
        RuntimeError: no site sent statistics (nothing is written).
    """
    from fedseg.fl.site_differences import site_report, write_report

    report = {**(header or {}), **site_report(json.loads(Path(raw).read_text()), sites, settings)}
    if not report["sites"]:  # NVFlare's controller writes nothing then; a report of no site would pass for one
        raise RuntimeError(f"no site sent statistics (in {raw})")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    write_report(report, out_dir)
    return report
