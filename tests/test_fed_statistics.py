"""Federated statistics of images and labels (NVFlare's federated statistics with fedseg's site component): the site
statistics against NumPy on the same pixels, pooling, the site distances against SciPy, what leaves a site, and one
simulator run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedseg.fl.site_differences import histogram_emd, pooled_moments, site_report
from fedseg.fl.site_statistics import SiteImageStatistics, compute_site_columns

LOW, HIGH, BINS = 0.0, 200.0, 16


def _write_site(root: Path, seed: int, n: int = 4, size=(12, 10)) -> tuple:
    """A datalist of ``n`` random RGB PNGs with binary masks (one mask empty); ``(datalist, images (n, H, W, 3),
    masks (n, H, W) in {0, 1})`` as written."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    images = rng.integers(0, 256, size=(n, *size, 3), dtype=np.uint8)
    masks = (rng.random((n, *size)) < 0.3).astype(np.uint8)
    masks[-1] = 0  # an image without the class: prevalence below 1
    entries = []
    for i in range(n):
        Image.fromarray(images[i]).save(root / "images" / f"{i}.png")
        Image.fromarray(masks[i] * 255).save(root / "labels" / f"{i}.png")
        entries.append({"image": f"images/{i}.png", "label": f"labels/{i}.png"})
    datalist = root / "datalist.json"  # only the split described is read
    datalist.write_text(json.dumps({"training": entries, "validation": [], "test": [], "labels": {"background": 0, "lesion": 1}}))
    return str(datalist), images.astype(np.float64), masks


def _component(datalist: str, min_images: int = 0) -> SiteImageStatistics:
    stats = SiteImageStatistics(intensity_bins=BINS, intensity_range=[LOW, HIGH], min_images=min_images)
    stats.datalist = datalist
    stats.columns = compute_site_columns(datalist, "training", BINS, (LOW, HIGH))
    return stats


@pytest.fixture
def site(tmp_path):
    return _write_site(tmp_path / "site-1", seed=0)


def test_statistics_match_numpy_on_the_same_pixels(site):
    datalist, images, masks = site
    stats = _component(datalist)
    for k in range(3):
        x = images[..., k].ravel()
        f = f"intensity_c{k}"
        assert stats.count("training", f) == x.size
        assert stats.sum("training", f) == pytest.approx(x.sum())
        assert stats.mean("training", f) == pytest.approx(x.mean())
        assert stats.stddev("training", f) == pytest.approx(x.std(ddof=1))
        assert stats.min_value("training", f) == x.min() and stats.max_value("training", f) == x.max()
        hist = stats.histogram("training", f, BINS, LOW, HIGH)
        np.testing.assert_array_equal([b.sample_count for b in hist.bins], np.histogram(x, BINS, (LOW, HIGH))[0])
        assert [b.low_value for b in hist.bins] == pytest.approx(np.linspace(LOW, HIGH, BINS + 1)[:-1])
        outside = ((x < LOW) | (x > HIGH)).sum()
        assert stats.sum("training", f"outside_range_c{k}") == outside > 0
    fractions = masks.reshape(len(masks), -1).mean(axis=1)
    assert stats.count("training", "fg_fraction_lesion") == len(masks)  # records are images
    assert stats.mean("training", "fg_fraction_lesion") == pytest.approx(fractions.mean())
    assert stats.stddev("training", "fg_fraction_lesion") == pytest.approx(fractions.std(ddof=1))
    assert stats.mean("training", "present_lesion") == pytest.approx((fractions > 0).mean()) == 0.75
    hist = stats.histogram("training", "fg_fraction_lesion", 5, 0.0, 1.0)
    np.testing.assert_array_equal([b.sample_count for b in hist.bins], np.histogram(fractions, 5, (0, 1))[0])
    assert stats.mean("training", "size_0") == 10 and stats.mean("training", "size_1") == 12  # MONAI's W, H


def test_histogram_on_other_bins_rereads_the_images(site):
    """A histogram on bins the first pass did not compute comes from the same pixels."""
    datalist, images, _ = site
    stats = _component(datalist)
    hist = stats.histogram("training", "intensity_c1", 7, 10.0, 250.0)
    np.testing.assert_array_equal([b.sample_count for b in hist.bins], np.histogram(images[..., 1], 7, (10, 250))[0])


def test_pooled_is_the_count_weighted_combination(tmp_path):
    a, b = (_write_site(tmp_path / s, seed=i, n=3 + i) for i, s in enumerate(("site-1", "site-2")))
    sa, sb = _component(a[0]), _component(b[0])
    f = "intensity_c0"
    mean, std = pooled_moments([sa.count("training", f), sb.count("training", f)],
                               [sa.mean("training", f), sb.mean("training", f)],
                               [sa.stddev("training", f), sb.stddev("training", f)])
    both = np.concatenate([a[1][..., 0].ravel(), b[1][..., 0].ravel()])
    assert mean == pytest.approx(both.mean()) and std == pytest.approx(both.std(ddof=1))
    # the report's pooled values and histogram from what the two sites sent (NVFlare's JSON layout)
    raw = {f: {stat: {name: {"training": value(s)} for name, s in (("site-1", sa), ("site-2", sb))}
               for stat, value in (
                   ("count", lambda s: s.count("training", f)), ("mean", lambda s: s.mean("training", f)),
                   ("stddev", lambda s: s.stddev("training", f)),
                   ("histogram", lambda s: [list(bin_) for bin_ in s.histogram("training", f, BINS, LOW, HIGH).bins]))}}
    pooled = site_report(raw, ["site-1", "site-2"])["pooled"][f]
    assert pooled["count"] == both.size and pooled["mean"] == pytest.approx(both.mean())
    assert pooled["stddev"] == pytest.approx(both.std(ddof=1))
    np.testing.assert_array_equal(pooled["histogram"]["counts"], np.histogram(both, BINS, (LOW, HIGH))[0])


def test_emd_matches_scipy_on_the_same_histograms():
    from scipy.stats import wasserstein_distance

    rng = np.random.default_rng(3)
    edges = np.linspace(0, 256, 65)
    centres = (edges[:-1] + edges[1:]) / 2
    for _ in range(5):
        a, b = rng.integers(0, 50, 64).astype(float), rng.integers(0, 50, 64).astype(float)
        assert histogram_emd(edges, a, b) == pytest.approx(wasserstein_distance(centres, centres, a, b))
    assert histogram_emd(edges, a, a) == pytest.approx(0.0, abs=1e-9)


def _site_results(stats: SiteImageStatistics, min_count: int) -> tuple:
    """What the site's NVFlare task handler returns for the two statistics tasks (the second given the site's own
    first results as the "global" ones), each after NVFlare's privacy cleansers as ``StatsJob`` configures them."""
    from nvflare.apis.fl_context import FLContext
    from nvflare.apis.shareable import Shareable
    from nvflare.app_common.abstract.statistics_spec import StatisticConfig
    from nvflare.app_common.app_constant import StatisticsConstants as StC
    from nvflare.app_common.executors.statistics.statistics_task_handler import StatisticsTaskHandler
    from nvflare.app_common.statistics.histogram_bins_cleanser import HistogramBinsCleanser
    from nvflare.app_common.statistics.min_count_cleanser import MinCountCleanser
    from nvflare.app_common.statistics.min_max_cleanser import AddNoiseToMinMax
    from nvflare.fuel.utils import fobs

    from fedseg.fl.fed_statistics import statistic_configs

    handler = StatisticsTaskHandler(generator_id="stats_generator")
    handler.stats_generator = stats
    configs = statistic_configs(["background", "lesion"], BINS, (LOW, HIGH), fraction_bins=2)
    results, inputs = [], {}
    for task_key, names in ((StC.STATS_1st_STATISTICS, ("count", "sum", "mean", "min", "max")),
                            (StC.STATS_2nd_STATISTICS, ("histogram", "var", "stddev"))):
        targets = [StatisticConfig(name, configs.get(name, {})) for name in names]
        task = Shareable({StC.STATISTICS_TASK_KEY: task_key, StC.STATS_TARGET_STATISTICS: fobs.dumps(targets), **inputs})
        result = handler.execute_task(StC.FED_STATS_TASK, task, FLContext(), None)
        statistics = fobs.loads(result[task_key])
        if task_key == StC.STATS_1st_STATISTICS:
            inputs = {StC.STATS_MIN: statistics["min"], StC.STATS_MAX: statistics["max"],
                      StC.STATS_GLOBAL_MEAN: statistics["mean"], StC.STATS_GLOBAL_COUNT: statistics["count"]}
        for cleanser in (MinCountCleanser(min_count), AddNoiseToMinMax(0.1, 0.3), HistogramBinsCleanser(10)):
            statistics, _ = cleanser.apply(statistics, "site-1")
        results.append(statistics)
    return tuple(results)


def test_a_site_sends_only_aggregates(site):
    """One number per feature and statistic, histograms on the configured bins; the per-image histograms (2 bins over
    4 images: more than 10 % of the records) stay at the site (NVFlare's HistogramBinsCleanser)."""
    from nvflare.app_common.abstract.statistics_spec import Histogram

    datalist, images, _ = site
    first, second = _site_results(_component(datalist), min_count=1)
    for statistics in (first, second):
        for stat, per_ds in statistics.items():
            for feature, value in per_ds["training"].items():
                if stat == "histogram":
                    assert isinstance(value, Histogram) and len(value.bins) in (BINS, 2), (feature, value)
                else:
                    assert isinstance(value, (int, float)), (stat, feature, value)  # nothing per image
    assert set(first["count"]["training"]) == {*(f"intensity_c{k}" for k in range(3)),
                                               *(f"outside_range_c{k}" for k in range(3)),
                                               "size_0", "size_1", "fg_fraction_lesion", "present_lesion"}
    assert first["count"]["training"]["size_0"] == len(images)
    assert first["max"]["training"]["intensity_c0"] > images[..., 0].max()  # NVFlare's noise on max
    assert set(second["histogram"]["training"]) == {*(f"intensity_c{k}" for k in range(3)),
                                                    *(f"outside_range_c{k}" for k in range(3))}


def test_a_site_with_fewer_images_than_the_minimum_sends_nothing(site):
    """4 images < min_count 5: NVFlare's cleanser keeps the per-image statistics at the site, and the component offers
    no intensity statistic (over thousands of pixels the cleanser alone would let them leave)."""
    datalist, images, _ = site
    small = len(images) + 1
    first, second = _site_results(_component(datalist, min_images=small), min_count=small)
    for statistics, stats in ((first, ("sum", "mean", "min", "max")), (second, ("histogram", "var", "stddev"))):
        for stat in stats:
            assert not statistics[stat]["training"], (stat, statistics[stat]["training"])
    # the cleanser alone (a component without the image minimum) would send the pixel statistics
    first, _ = _site_results(_component(datalist), min_count=small)
    assert "intensity_c0" in first["mean"]["training"] and "size_0" not in first["mean"]["training"]


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """The one simulator run of this module: ``fedseg stats`` over three sites of tiny built-in data. site-2 has a
    truncated image (it sends nothing: the others' statistics are written all the same); site-3 keeps 2 training
    images, under the minimum count (it sends counts only). Returns ``(mapping, run folder, report, printed)``."""
    import contextlib
    import io
    import time

    from fedseg.cli import main
    from fedseg.data.synthetic import generate_federation

    root = tmp_path_factory.mktemp("fedstats")
    mapping = {s: str(p) for s, p in generate_federation("polyp", ["site-1", "site-2", "site-3"], root / "data",
                                                          profile="tiny").items()}
    broken_list = json.loads(Path(mapping["site-2"]).read_text())
    broken = Path(mapping["site-2"]).parent / broken_list["training"][1]["image"]
    broken.write_bytes(broken.read_bytes()[:40])
    small = json.loads(Path(mapping["site-3"]).read_text())
    small["training"] = small["training"][:2]
    Path(mapping["site-3"]).write_text(json.dumps(small))
    index = root / "site_datalists.json"
    index.write_text(json.dumps(mapping))
    out = root / "bench" / "site_statistics"  # where fedseg bench --site-stats run puts them: the bench test reads it
    printed = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(printed):
        main(["stats", "--site-datalists", str(index), "--out", str(out), "--min-count", "3",
              "--max-bins-percent", "50", "--intensity-bins", "8", "--site-wait", "30"])
    # every site answers (site-2 with nothing): no task waits out --site-wait
    assert time.monotonic() - started < 100
    return mapping, out, json.loads((out / "stats.json").read_text()), printed.getvalue()


@pytest.mark.timeout(180)
def test_a_site_that_drops_out_is_named_and_the_others_are_reported(federation):
    """A truncated image at site-2: the job ends in bounded time with site-1's and site-3's statistics; stats.json,
    stats.md and the printed summary say site-2 sent nothing, and its log names the file in one line."""
    from fedseg.fl.fed_statistics import site_failures

    mapping, out, report, printed = federation
    said = "site-2 sent nothing (dropped out); statistics of site-1, site-3."
    assert report["sites"] == ["site-1", "site-3"] and report["dropped_sites"] == ["site-2"]
    assert report["summary"][0] == said and "site-2" not in report["per_site"]
    assert said in (out / "stats.md").read_text() and said in printed
    assert printed.rstrip().splitlines()[-1].startswith("statistics of site-1, site-3 (site-2 sent nothing): ")
    failures = site_failures(out / "workspace", list(mapping))
    assert list(failures) == ["site-2"] and failures["site-2"].startswith("cannot read image ")
    assert "\n" not in failures["site-2"] and "001.png" in failures["site-2"]


@pytest.mark.timeout(180)
def test_fedstats_job_runs_in_the_simulator(federation):
    """The job on tiny built-in data: code-free, counts as the datalists; a site under the minimum count sends
    counts only and the report says what it withheld."""
    mapping, out, report, _ = federation
    assert not report["per_site"]["site-3"].get("intensity_c0") and "intensity_c0: mean" in report["withheld"]["site-3"]
    assert np.isnan(report["distances"]["intensity_emd"]["intensity_c0"][0][1])
    assert report["pooled"]["intensity_c0"]["sites_included"] == ["site-1"]
    assert not list((out / "job").rglob("custom"))  # configuration only (no BYOC)
    n = len(json.loads(Path(mapping["site-1"]).read_text())["training"])
    assert report["per_site"]["site-1"]["size_0"]["count"] == n
    assert report["per_site"]["site-3"]["size_0"]["count"] == 2
    assert np.asarray(report["distances"]["intensity_emd"]["intensity_c0"]).shape == (2, 2)
    assert "| site-1 |" in (out / "stats.md").read_text()
    assert report["settings"]["min_sites"] == 1 and report["settings"]["site_wait"] == 30


def test_when_every_site_fails_stats_exits_in_one_line_and_writes_no_report(tmp_path, monkeypatch):
    """The simulator's failure (here: no site sent statistics) ends ``fedseg stats`` non-zero with one line, and the
    run folder holds no stats.json or stats.md (an earlier run's are removed first)."""
    from fedseg.cli import main
    from fedseg.fl import fed_statistics

    def no_site(job, workspace, sites, timeout=3600):
        raise RuntimeError("no site sent statistics (site-1: cannot read image a.png; site-2: cannot read image "
                           f"b.png); the logs under {workspace} say more")

    monkeypatch.setattr(fed_statistics, "run_simulator", no_site)
    out = tmp_path / "run"
    out.mkdir()
    (out / "stats.json").write_text("{}")  # an earlier run's
    with pytest.raises(SystemExit) as exc:
        main(["stats", "--family", "polyp", "-n", "2", "--data-profile", "tiny", "--out", str(out)])
    message = str(exc.value.code)
    assert message.startswith("fedseg stats: no site sent statistics (site-1: ") and "\n" not in message
    assert not (out / "stats.json").exists() and not (out / "stats.md").exists()


def test_site_failures_reads_each_sites_failure_line(tmp_path):
    from fedseg.fl.fed_statistics import site_failures
    from fedseg.fl.site_statistics import SITE_FAILURE

    (tmp_path / "site-1").mkdir()
    (tmp_path / "site-1" / "log.txt").write_text(f"x - ERROR - [identity=site-1] - {SITE_FAILURE}site-1: cannot read "
                                                 "image a.png: OSError: truncated\nTraceback ...\n")
    (tmp_path / "site-2").mkdir()
    (tmp_path / "site-2" / "log.txt").write_text("all well\n")
    assert site_failures(tmp_path, ["site-1", "site-2", "site-3"]) == {
        "site-1": "cannot read image a.png: OSError: truncated"}


def test_committed_fedstats_job_matches_a_fresh_export(tmp_path):
    """jobs/fedstats is what ``fedseg stats --export-job jobs`` writes (as tests/test_jobs.py checks the methods'
    jobs): one client app for every site, configuration only, no machine paths."""
    import filecmp

    from fedseg.cli import main

    committed = Path(__file__).resolve().parents[1] / "jobs" / "fedstats"
    main(["stats", "--export-job", str(tmp_path)])
    exported = tmp_path / "fedstats"

    def files(root):
        return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())

    assert files(exported) == files(committed), "regenerate with `fedseg stats --export-job jobs`"
    for rel in files(exported):
        assert filecmp.cmp(exported / rel, committed / rel, shallow=False), f"jobs/fedstats/{rel} drifted"
    assert json.loads((committed / "meta.json").read_text())["deploy_map"] == {"app": ["@ALL"]}
    for cfg in committed.rglob("*.json"):
        assert not any(p in cfg.read_text() for p in ("/work/", "/tmp/", "/root/")), cfg
    server = json.loads((committed / "app" / "config" / "config_fed_server.json").read_text())
    controller = server["workflows"][0]["args"]
    assert controller["min_clients"] == 1 and controller["wait_time_after_min_received"] == 120


@pytest.mark.timeout(180)
def test_stats_of_a_bundle_describe_what_its_network_sees(tmp_path):
    """``fedseg stats --bundle bundles/unet2d_seg --site-overrides FILE --set image_size=48``: two sites of tiny built-in data
    (32 px, 0..255) described after the bundle's preprocessing: resized to 48 px, intensities scaled to 0..1, the
    bundle's classes; each site's values are those of its own images through the same transforms."""
    import contextlib
    import io

    from fedseg.bundle import default_bundle_dir
    from fedseg.cli import main
    from fedseg.data.synthetic import generate_federation
    from fedseg.fl.site_statistics import bundle_images, columns_of

    bundle = str(default_bundle_dir("unet2d_seg"))
    mapping = generate_federation("polyp", ["site-1", "site-2"], tmp_path / "data", profile="tiny")
    overrides = {site: {"dataset_dir": str(Path(p).parent)} for site, p in mapping.items()}
    (tmp_path / "sites.json").write_text(json.dumps(overrides))
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        main(["stats", "--bundle", bundle, "--site-overrides", str(tmp_path / "sites.json"), "--set",
              "image_size=48", "--out", str(tmp_path / "run"), "--min-count", "3", "--max-bins-percent", "50",
              "--intensity-bins", "8"])
    report = json.loads((tmp_path / "run" / "stats.json").read_text())
    assert report["sites"] == ["site-1", "site-2"] and "statistics of site-1, site-2: " in printed.getvalue()
    assert report["settings"]["bundle_overrides"] == {"image_size": 48}
    for site, values in overrides.items():
        sent = report["per_site"][site]
        names, images = bundle_images(bundle, {"image_size": 48, **values})
        local = columns_of(images(), names, 8, None)
        assert names == ["background", "class_1"] and "present_class_1" in sent
        assert sent["size_0"]["mean"] == sent["size_1"]["mean"] == 48
        assert sent["size_0"]["count"] == len(json.loads(Path(mapping[site]).read_text())["training"])
        column = local.pixels["intensity_c0"]
        assert sent["intensity_c0"]["count"] == column.count
        assert sent["intensity_c0"]["mean"] == pytest.approx(column.sum / column.count, abs=1e-4) and column.max <= 1.0


def test_stats_parser():
    from fedseg.cli import _cmd_stats, build_parser

    args = build_parser().parse_args(["stats", "--family", "nuclei", "-n", "2", "--min-count", "3"])
    assert args.func is _cmd_stats and args.n_clients == 2 and args.min_count == 3 and args.split == "training"


def test_stats_intensity_range_option(tmp_path):
    from fedseg.cli import _stats_intensity_range

    assert _stats_intensity_range(["auto"], None, (0.0, 256.0)) is None
    assert _stats_intensity_range(["-1000", "1000"], None, (0.0, 256.0)) == (-1000.0, 1000.0)
    assert _stats_intensity_range(None, None, (0.0, 256.0)) == (0.0, 256.0)
    volume = tmp_path / "datalist.json"
    volume.write_text(json.dumps({"spatial_dims": 3, "training": [], "validation": [], "test": []}))
    assert _stats_intensity_range(None, {"site-1": str(volume)}, (0.0, 256.0)) is None  # no fixed scale: auto
    with pytest.raises(ValueError, match="LOW < HIGH"):
        _stats_intensity_range(["5", "1"], None, None)


def test_summary_names_the_darker_site_and_its_smaller_objects():
    """Two sites as NVFlare's JSON would hold them: site-2 darker, with smaller and rarer lesions."""
    edges = np.linspace(0, 256, 5)

    def hist(counts):
        return [[edges[i], edges[i + 1], c] for i, c in enumerate(counts)]

    def per_site(a, b):
        return {"site-1": {"training": a}, "site-2": {"training": b}}

    raw = {
        "intensity_c0": {"count": per_site(100, 100), "mean": per_site(150.0, 50.0), "stddev": per_site(10.0, 10.0),
                         "histogram": per_site(hist([0, 0, 100, 0]), hist([100, 0, 0, 0]))},
        "fg_fraction_lesion": {"count": per_site(20, 20), "mean": per_site(0.2, 0.05), "stddev": per_site(0.01, 0.01)},
        "present_lesion": {"count": per_site(20, 20), "mean": per_site(1.0, 0.5), "stddev": per_site(0.0, 0.5)},
    }
    report = site_report(raw, ["site-1", "site-2"])
    assert report["distances"]["intensity_emd"]["intensity_c0"][0][1] == pytest.approx(128.0)  # two bins of 64 apart
    site2 = next(s for s in report["summary"] if s.startswith("site-2"))
    assert "darker" in site2 and "lesion regions are smaller" in site2 and "fewer of its images" in site2
    assert report["distances"]["prevalence"]["lesion"][0][1] == pytest.approx(0.5)
    assert not any("outside the histogram range" in s for s in report["summary"])
    raw["outside_range_c0"] = {"count": per_site(100, 100), "mean": per_site(0.0, 0.8), "stddev": per_site(0.0, 0.4)}
    assert "80% of site-2's channel-0 values fall outside" in " ".join(site_report(raw, ["site-1", "site-2"])["summary"])


def test_a_declared_class_absent_at_a_site_is_said_in_one_line():
    """site-2's datalist declares 'cup' but none of its 20 images has a cup pixel (prevalence 0 over 20 images): the
    summary says so plainly, instead of 'appears in fewer of its images (0%)' and 'smaller regions'; a site that sent
    nothing (site-3, absent from NVFlare's JSON) is named, and the report is of the other two."""
    def per_site(a, b):
        return {"site-1": {"training": a}, "site-2": {"training": b}}

    raw = {"present_cup": {"count": per_site(10, 20), "mean": per_site(0.9, 0.0), "stddev": per_site(0.3, 0.0)},
           "fg_fraction_cup": {"count": per_site(10, 20), "mean": per_site(0.2, 0.0), "stddev": per_site(0.1, 0.0)},
           "present_disc": {"count": per_site(10, 20), "mean": per_site(1.0, 1.0), "stddev": per_site(0.0, 0.0)}}
    report = site_report(raw, ["site-1", "site-2", "site-3"])
    assert "site-2 has no pixels of declared class 'cup' in any of its 20 images." in report["summary"]
    assert not any(s.startswith("site-2:") and "cup" in s for s in report["summary"]), report["summary"]
    assert report["summary"][0] == "site-3 sent nothing (dropped out); statistics of site-1, site-2."
    assert report["sites"] == ["site-1", "site-2"] and report["dropped_sites"] == ["site-3"]
    assert not any("disc" in s for s in report["summary"])
    raw["present_cup"]["mean"] = per_site(0.9, 0.05)  # present in 1 of its 20 images: rarer, not absent
    summary = site_report(raw, ["site-1", "site-2"])["summary"]
    assert not any("no pixels" in s for s in summary) and any("cup appears in fewer" in s for s in summary)


def test_figures_are_drawn_from_what_the_sites_sent(tmp_path):
    """Overlaid intensity histograms, the distance heatmap (a site that withheld its histogram leaves its pairs blank)
    and no foreground-fraction figure where no site sent that histogram; stats.md links every figure."""
    from fedseg.fl.site_differences import write_report

    edges = np.linspace(0, 256, 5)
    hist = [[edges[i], edges[i + 1], c] for i, c in enumerate([5, 10, 20, 5])]
    raw = {"intensity_c0": {"count": {s: {"training": 40} for s in ("a", "b", "c")},
                            "mean": {s: {"training": m} for s, m in (("a", 100.0), ("b", 120.0), ("c", 90.0))},
                            "stddev": {s: {"training": 10.0} for s in ("a", "b", "c")},
                            "histogram": {"a": {"training": hist}, "b": {"training": hist}}},
           "fg_fraction_lesion": {"count": {s: {"training": 20} for s in ("a", "b", "c")},
                                  "mean": {s: {"training": 0.1} for s in ("a", "b", "c")}}}
    report = site_report(raw, ["a", "b", "c"])
    assert np.isnan(report["distances"]["intensity_emd"]["intensity_c0"][0][2])
    write_report(report, tmp_path)
    plots = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert plots == ["intensity_histograms.png", "site_distances.png"]
    for name in plots:
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(plots/{name})" in (tmp_path / "stats.md").read_text()


def test_bench_reads_or_runs_the_site_statistics(tmp_path, monkeypatch):
    """``fedseg bench --site-stats``: a given stats.json is read (the bench's sites it lacks named), "run" runs the job
    once into the bench's folder and reads it again on resume; the verdict's page gets the summary."""
    from fedseg.bench.report import site_statistics_lines
    from fedseg.fl.fed_statistics import bench_site_statistics

    stats = tmp_path / "given" / "stats.json"
    stats.parent.mkdir()
    stats.write_text(json.dumps({"sites": ["site-1"], "summary": ["site-1: its images are darker (...)."]}))
    mapping = {"site-1": "a.json", "site-2": "b.json"}
    given = bench_site_statistics(tmp_path, mapping, str(stats))
    assert given["missing_sites"] == ["site-2"] and given["summary"] == ["site-1: its images are darker (...)."]
    lines = site_statistics_lines(given)
    assert lines[0] == "## How the sites differ" and "- site-1: its images are darker (...)." in lines
    assert "- The statistics lack site-2." in lines and site_statistics_lines(None) == []
    with pytest.raises(ValueError, match="no such stats.json"):
        bench_site_statistics(tmp_path, mapping, str(tmp_path / "none.json"))
    (tmp_path / "other.json").write_text(json.dumps({"approaches": {}}))
    with pytest.raises(ValueError, match="not a stats.json"):
        bench_site_statistics(tmp_path, mapping, str(tmp_path / "other.json"))

    # "run": the statistics job over the bench's datalists into its site_statistics/, run once (here a stand-in for
    # the simulator run), then read again on resume
    from fedseg.fl import fed_statistics

    calls = []

    def fake_run(mapping, out, intensity_range=None):
        calls.append((dict(mapping), Path(out), intensity_range))
        Path(out).mkdir(parents=True)
        Path(out, "stats.json").write_text(json.dumps({"sites": ["site-1"], "summary": ["s"]}))

    monkeypatch.setattr(fed_statistics, "run_fedstats", fake_run)
    mapping = {site: str(tmp_path / f"{site}.json") for site in ("site-1", "site-2")}
    for datalist in mapping.values():
        Path(datalist).write_text(json.dumps({"training": [], "validation": [], "test": []}))
    ran = bench_site_statistics(tmp_path / "fresh", mapping, "run")
    assert calls == [(mapping, tmp_path / "fresh" / "site_statistics", (0.0, 256.0))] and ran["missing_sites"] == ["site-2"]
    assert bench_site_statistics(tmp_path / "fresh", mapping, "run") == ran and len(calls) == 1


@pytest.mark.timeout(180)
def test_bench_reads_the_statistics_run_with_a_dropped_site(federation):
    """The module's run sits where ``fedseg bench --site-stats run`` puts it: the bench reads it (no new run) and
    names the site that sent nothing among the sites it lacks."""
    from fedseg.bench.report import site_statistics_lines
    from fedseg.fl.fed_statistics import bench_site_statistics

    mapping, out, report, _ = federation
    written = (out / "stats.json").stat().st_mtime_ns
    ran = bench_site_statistics(out.parent, mapping, "run")
    assert ran["sites"] == ["site-1", "site-3"] and ran["missing_sites"] == ["site-2"]
    assert ran["summary"] == report["summary"] and (out / "stats.json").stat().st_mtime_ns == written
    assert "- The statistics lack site-2." in site_statistics_lines(ran)


def test_bench_parser_takes_site_stats():
    from fedseg.cli import build_parser

    args = build_parser().parse_args(["bench", "--out", "x", "--site-stats", "run"])
    assert args.site_stats == "run"
    assert build_parser().parse_args(["bench", "--out", "x"]).site_stats is None


def test_sites_that_withheld_everything_are_not_called_alike():
    """Only counts arrived (every site under the minimum count): the report lists what each site withheld, and the
    summary says so instead of calling the sites alike."""
    raw = {"size_0": {"count": {"site-1": {"training": 8}, "site-2": {"training": 8}}}}
    report = site_report(raw, ["site-1", "site-2"])
    assert report["withheld"]["site-1"] == [f"size_0: {s}" for s in ("sum", "mean", "stddev", "min", "max", "histogram")]
    assert not any("alike" in s for s in report["summary"])
    assert any("withheld statistics of site-1, site-2" in s for s in report["summary"])


def test_results_page_renders_a_stats_run():
    """The sites page's renderers: one row per site and the pooled one, and the mean-over-channels distance matrix
    (by hand: the channels' EMDs averaged), with the run's caption and summary."""
    from benchmarks.sites.render import render_site_distances, render_site_statistics

    edges = np.linspace(0, 256, 5)

    def hist(counts):
        return [[edges[i], edges[i + 1], c] for i, c in enumerate(counts)]

    def per_site(a, b):
        return {"site-1": {"training": a}, "site-2": {"training": b}}

    raw = {f"intensity_c{k}": {"count": per_site(100, 100), "mean": per_site(150.0, 50.0),
                               "stddev": per_site(10.0, 10.0),
                               "histogram": per_site(hist([0, 0, 100, 0]), hist([100, 0, 0, 0] if k else [0, 100, 0, 0]))}
           for k in range(2)}
    data = {"command": "fedseg stats --site-datalists x --out {out}", "date": "2026-11-29T10:00:00",
            "data": {"site-1": {"training": 10}, "site-2": {"training": 12}}, **site_report(raw, ["site-1", "site-2"])}
    table = render_site_statistics("t", {"title": "Sites"}, [data])
    assert table[0].startswith("**Sites.** 2 sites") and [line.split(" | ")[0] for line in table[4:]] == [
        "| site-1", "| site-2", "| pooled"]
    distances = render_site_distances("d", {"title": "Far"}, [data])
    # channel 0: one bin (64) apart, channel 1: two bins (128) apart -> mean 96
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in distances[-2:]]
    assert cells == [["site-1", "0.00", "96.00"], ["site-2", "96.00", "0.00"]]
    assert "site-2: its images are darker" in distances[0]


def test_an_unreadable_image_fails_in_one_line_naming_it(tmp_path):
    """A truncated image at one site: the site's error names the file; a mask of another size than its image is
    refused the same way."""
    from fedseg.data.datalist import DatalistError
    from fedseg.data.synthetic import generate_federation
    mapping = {s: str(p) for s, p in generate_federation("polyp", ["site-1", "site-2"], tmp_path / "data",
                                                          profile="tiny").items()}
    datalist = json.loads(Path(mapping["site-2"]).read_text())
    broken = Path(mapping["site-2"]).parent / datalist["training"][1]["image"]
    broken.write_bytes(broken.read_bytes()[:40])
    with pytest.raises(DatalistError, match=f"cannot read image .*{broken.name}"):
        compute_site_columns(mapping["site-2"], "training", BINS, (LOW, HIGH))

    datalist_1 = json.loads(Path(mapping["site-1"]).read_text())
    other = datalist_1["training"][1]["label"]
    datalist_1["training"][0]["label"] = datalist_1["training"][0]["label"] if other is None else other
    first = Path(mapping["site-1"]).parent
    from PIL import Image

    small = first / "small_mask.png"
    Image.new("L", (5, 7)).save(small)
    datalist_1["training"][0]["label"] = str(small)
    Path(mapping["site-1"]).write_text(json.dumps(datalist_1))
    with pytest.raises(DatalistError, match="small_mask.png is \\(7, 5\\)|small_mask.png is \\(5, 7\\)"):
        compute_site_columns(mapping["site-1"], "training", BINS, (LOW, HIGH))
