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


def test_fedstats_job_runs_in_the_simulator(tmp_path):
    """The job on two sites of tiny built-in data: code-free, every site in the report, counts as the datalists."""
    from fedseg.data.synthetic import generate_federation
    from fedseg.fl.fed_statistics import run_fedstats

    mapping = {s: str(p) for s, p in generate_federation("polyp", ["site-1", "site-2", "site-3"], tmp_path / "data",
                                                          profile="tiny").items()}
    # site-3 keeps 2 training images, under the minimum count: it sends nothing, the report says what it withheld
    small = json.loads(Path(mapping["site-3"]).read_text())
    small["training"] = small["training"][:2]
    Path(mapping["site-3"]).write_text(json.dumps(small))
    report = run_fedstats(mapping, tmp_path / "run", min_count=3, max_bins_percent=50, intensity_bins=8)
    assert not report["per_site"]["site-3"].get("intensity_c0") and "intensity_c0: mean" in report["withheld"]["site-3"]
    assert np.isnan(report["distances"]["intensity_emd"]["intensity_c0"][0][2])
    assert report["pooled"]["intensity_c0"]["sites_included"] == ["site-1", "site-2"]
    del mapping["site-3"]
    assert not list((tmp_path / "run" / "job").rglob("custom"))  # configuration only (no BYOC)
    assert report["sites"] == ["site-1", "site-2", "site-3"]
    for site, datalist in mapping.items():
        n = len(json.loads(Path(datalist).read_text())["training"])
        assert report["per_site"][site]["size_0"]["count"] == n
    assert np.asarray(report["distances"]["intensity_emd"]["intensity_c0"]).shape == (3, 3)
    assert json.loads((tmp_path / "run" / "stats.json").read_text())["summary"] == report["summary"]
    assert "| site-1 |" in (tmp_path / "run" / "stats.md").read_text()


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


def test_bench_reads_or_runs_the_site_statistics(tmp_path):
    """``fedseg bench --site-stats``: a given stats.json is read (the bench's sites it lacks named), "run" runs the job
    once into the bench's folder and reads it again on resume; the verdict's page gets the summary."""
    from fedseg.bench.report import site_statistics_lines
    from fedseg.data.synthetic import generate_federation
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

    mapping = {s: str(p) for s, p in generate_federation("polyp", ["site-1", "site-2"], tmp_path / "data",
                                                          profile="tiny").items()}
    ran = bench_site_statistics(tmp_path / "bench", mapping, "run")
    assert ran["sites"] == ["site-1", "site-2"] and not ran["missing_sites"] and ran["summary"]
    written = Path(ran["stats"]).stat().st_mtime_ns
    assert bench_site_statistics(tmp_path / "bench", mapping, "run") == ran
    assert Path(ran["stats"]).stat().st_mtime_ns == written  # resumed: read, not run again


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
