"""A site's image and label statistics as NVFlare's federated statistics see them (a ``Statistics`` component).

NVFlare's statistics are tabular: a dataset (here the datalist split, ``training`` by default) holds features, and a
feature is a column of records. Two kinds of records describe a segmentation site:

* **pixels** (voxels for volumes): ``intensity_c{k}`` is channel ``k``'s intensity, ``outside_range_c{k}`` is 1 where
  that intensity falls outside the shared histogram range, else 0 (its mean is the share outside). Count, sum, mean,
  std and the histogram on the shared bins are exact over every pixel of the split, so pooling sites by count gives
  the pooled pixels' statistics.
* **images**: ``size_{d}`` is an image's extent along spatial axis ``d``; per foreground class ``fg_fraction_{name}``
  is the share of the image's pixels of that class and ``present_{name}`` is 1 where the class appears at all (its
  mean is the share of images in which it appears). NVFlare's minimum-count cleanser then counts images.

Only what NVFlare's ``StatisticsTaskHandler`` asks for leaves the site (count, sum, mean, std, variance about the
global mean, min/max, histograms), and the job's privacy filter cleanses it first. The per-image values and pixels
stay in this process.

Images are read with MONAI's ``LoadImage`` and the suite's reader (``fedseg.data.transforms.SegImageReader``, 16-bit
rasters scaled to 0..255 as training sees them); masks are decoded under the datalist's label space. With a MONAI
bundle, a site's images are its training items after the bundle's own preprocessing (:func:`bundle_images`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.statistics_spec import Bin, DataType, Feature, Histogram, HistogramType, Statistics

#: the default shared intensity histogram: 8-bit images (every built-in 2D family, and real rasters as read)
DEFAULT_INTENSITY_RANGE: Tuple[float, float] = (0.0, 256.0)
DEFAULT_INTENSITY_BINS = 64
#: per built-in family, where its intensities lie ``(low, high)``, or None: no fixed scale (MR), the range is the
#: sites' min/max as NVFlare's privacy noise widens them; absent = :data:`DEFAULT_INTENSITY_RANGE`
FAMILY_INTENSITY_RANGES: Dict[str, Optional[Tuple[float, float]]] = {"prostate3d": None}

INTENSITY = "intensity_c"
OUTSIDE = "outside_range_c"
SIZE = "size_"
SPACING = "spacing_"
FG_FRACTION = "fg_fraction_"
PRESENT = "present_"


def family_intensity_range(family: Optional[str]) -> Optional[Tuple[float, float]]:
    """The default shared intensity range of a built-in data ``family`` (8-bit for 2D rasters; None: the sites'
    noisy min/max)."""
    return FAMILY_INTENSITY_RANGES.get(family or "", DEFAULT_INTENSITY_RANGE)


@dataclass
class PixelColumn:
    """Running aggregates of one pixel feature: ``count``, ``sum``, ``sum_sq`` (float64), ``min``, ``max``."""

    count: int = 0
    sum: float = 0.0
    sum_sq: float = 0.0
    min: float = float("inf")
    max: float = float("-inf")

    def add(self, values: np.ndarray) -> None:
        """Add a flat float64 array of values."""
        self.count += int(values.size)
        self.sum += float(values.sum())
        self.sum_sq += float(np.square(values).sum())
        self.min = min(self.min, float(values.min()))
        self.max = max(self.max, float(values.max()))

    def sq_dev(self, about: float) -> float:
        """``sum((x - about)^2)`` over the column."""
        return self.sum_sq - 2.0 * about * self.sum + self.count * about * about


@dataclass
class SiteColumns:
    """Every feature of one split: pixel columns (aggregates) and image columns (one value per image, kept local)."""

    pixels: Dict[str, PixelColumn] = field(default_factory=dict)
    images: Dict[str, List[float]] = field(default_factory=dict)
    histograms: Dict[Tuple[str, int, float, float], np.ndarray] = field(default_factory=dict)


def load_image(path: str) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """An image file -> ``((C, *spatial) float64, voxel spacing (D,) or None)``, read by MONAI's ``LoadImage`` with the
    suite's reader; the spacing of a NIfTI volume, None for a raster (which declares none)."""
    from monai.transforms import LoadImage

    from fedseg.data.datalist import monai_reader_name
    from fedseg.data.transforms import SegImageReader

    img = LoadImage(reader=SegImageReader(image_modes=True), image_only=True, ensure_channel_first=True)(path)
    spacing = np.asarray(img.pixdim, dtype=np.float64) if monai_reader_name(path) == "NibabelReader" else None
    return np.asarray(img, dtype=np.float64), spacing


def load_classes(path: str, label_space) -> np.ndarray:
    """A mask file -> class indices ``(*spatial)`` int64 under ``label_space`` (MONAI ``LoadImage``, then the suite's
    decoding, which names the file on undeclared values)."""
    from monai.transforms import LoadImage

    from fedseg.data.datalist import decode_mask
    from fedseg.data.transforms import SegImageReader

    mask = np.asarray(LoadImage(reader=SegImageReader(), image_only=True)(path))
    return decode_mask(mask, Path(path), label_space)


def pixel_histogram(values: np.ndarray, bins: int, low: float, high: float) -> np.ndarray:
    """Counts of ``values`` in ``bins`` equal bins over ``[low, high]`` (NumPy's rule: the last bin holds ``high``)."""
    return np.histogram(values, bins=bins, range=(low, high))[0].astype(np.int64)


def accumulate_image(columns: SiteColumns, image: np.ndarray, classes: np.ndarray, class_names: Sequence[str],
                     bins: int, value_range: Optional[Tuple[float, float]], spacing: Optional[np.ndarray] = None) -> None:
    """Add one image ``(C, *spatial)``, its class map ``(*spatial)`` and its voxel ``spacing`` (D,) (None: a raster)
    to ``columns``; ``class_names[0]`` is the background, which gets no per-class feature. ``value_range`` None: no
    shared range yet (nothing counts as outside, the histogram comes later on the range NVFlare sends)."""
    for k in range(image.shape[0]):
        values = image[k].ravel()
        columns.pixels.setdefault(f"{INTENSITY}{k}", PixelColumn()).add(values)
        outside = np.zeros_like(values)
        if value_range is not None:
            low, high = value_range
            outside = ((values < low) | (values > high)).astype(np.float64)
            key = (f"{INTENSITY}{k}", bins, low, high)
            columns.histograms[key] = columns.histograms.get(key, 0) + pixel_histogram(values, bins, low, high)
        columns.pixels.setdefault(f"{OUTSIDE}{k}", PixelColumn()).add(outside)
    for d, extent in enumerate(image.shape[1:]):
        columns.images.setdefault(f"{SIZE}{d}", []).append(float(extent))
    for d, step in enumerate(spacing if spacing is not None else ()):
        columns.images.setdefault(f"{SPACING}{d}", []).append(float(step))
    for c, name in enumerate(class_names[1:], start=1):
        fraction = float(np.mean(classes == c))
        columns.images.setdefault(f"{FG_FRACTION}{name}", []).append(fraction)
        columns.images.setdefault(f"{PRESENT}{name}", []).append(float(fraction > 0))


def split_entries(datalist: str, split: str) -> Tuple[List[Dict[str, Any]], Any]:
    """``(entries of split with absolute paths, the datalist's label space)``; a DatalistError names the file."""
    from fedseg.data.datalist import datalist_label_space, load_datalist, read_datalist_json

    path, data = read_datalist_json(datalist)
    entries = load_datalist(path, check_files=False, splits=(split,))[split]
    return entries, datalist_label_space(data, path)


#: one image of a site as the statistics read it: ``(where it comes from, image (C, *spatial) float64, class map
#: (*spatial) int64, voxel spacing (D,) or None)``
SiteImage = Tuple[str, np.ndarray, np.ndarray, Optional[np.ndarray]]


def datalist_images(datalist: str, split: str = "training") -> Iterator[SiteImage]:
    """Each image of ``split`` of a datalist with its decoded mask, as read from the files; a DatalistError names the
    file it cannot read (a missing, truncated or foreign file), not MONAI's reader stack."""
    from fedseg.data.datalist import DatalistError, entry_label_space

    entries, space = split_entries(datalist, split)
    for i, entry in enumerate(entries):
        where = f"{split}[{i}] of {datalist}"
        try:
            image, spacing = load_image(entry["image"])
        except Exception as e:
            raise DatalistError(f"cannot read image {entry['image']} ({where}): {type(e).__name__}: {e}") from None
        try:
            classes = load_classes(entry["label"], entry_label_space(space, entry, where))
        except DatalistError:
            raise
        except Exception as e:
            raise DatalistError(f"cannot read mask {entry['label']} ({where}): {type(e).__name__}: {e}") from None
        if tuple(classes.shape) != tuple(image.shape[1:]):
            raise DatalistError(f"mask {entry['label']} is {tuple(classes.shape)}, its image {entry['image']} "
                                f"{tuple(image.shape[1:])} ({where})")
        yield f"{entry['image']} ({where})", image, classes, spacing


def columns_of(images: Iterable[SiteImage], class_names: Sequence[str], bins: int = DEFAULT_INTENSITY_BINS,
               value_range: Optional[Tuple[float, float]] = DEFAULT_INTENSITY_RANGE) -> SiteColumns:
    """Every feature (module docstring) of ``images`` in one pass; a DatalistError names an image whose channels
    differ from the earlier ones' or whose class map is another size."""
    from fedseg.data.datalist import DatalistError

    columns = SiteColumns()
    channels = None
    for where, image, classes, spacing in images:
        if channels is not None and image.shape[0] != channels:
            raise DatalistError(f"{where} has {image.shape[0]} channels, earlier images have {channels}")
        channels = image.shape[0]
        if tuple(classes.shape) != tuple(image.shape[1:]):
            raise DatalistError(f"the mask of {where} is {tuple(classes.shape)}, its image {tuple(image.shape[1:])}")
        accumulate_image(columns, image, classes, class_names, bins, value_range, spacing)
    return columns


def compute_site_columns(datalist: str, split: str = "training", bins: int = DEFAULT_INTENSITY_BINS,
                         value_range: Optional[Tuple[float, float]] = DEFAULT_INTENSITY_RANGE) -> SiteColumns:
    """Every feature of ``split`` of one site's datalist (module docstring), in one pass over its images and masks."""
    return columns_of(datalist_images(datalist, split), split_entries(datalist, split)[1].names, bins, value_range)


def bundle_class_names(parser) -> List[str]:
    """The class names a MONAI bundle's config declares: its ``labels`` (``{index: name}``, ``{name: index}`` or a
    list), else ``background`` and ``class_k`` for each of its ``num_classes``."""
    labels = parser.get_parsed_content("labels") if "labels" in parser else None
    if isinstance(labels, dict) and labels:
        if all(str(k).isdigit() for k in labels):
            return [str(labels[k]) for k in sorted(labels, key=int)]
        return [str(name) for name, _ in sorted(labels.items(), key=lambda kv: int(kv[1]))]
    if isinstance(labels, (list, tuple)) and labels:
        return [str(name) for name in labels]
    n = int(parser.get_parsed_content("num_classes"))
    return ["background", *(f"class_{k}" for k in range(1, n))]


def bundle_images(bundle: str, overrides: Dict[str, Any]) -> Tuple[List[str], Callable[[], Iterator[SiteImage]]]:
    """A site's training images as a MONAI bundle's network sees them: ``(class names, images)``, where ``images()``
    yields each item of the bundle's ``train#dataset#data`` (with ``overrides``: the bundle's and this site's config
    ids) after the bundle's own ``train#preprocessing`` without its random transforms (augmentation, random crops
    change from epoch to epoch), the label channel as class indices.

    Raises:
        fedseg.bundle.BundleError: no such bundle, an id it does not have, no ``train#dataset#data``.
    """
    from monai.transforms import Compose, Randomizable

    from fedseg.bundle import BundleError, read_bundle
    from fedseg.data.datalist import DatalistError
    from fedseg.fl.monai_bundle_client import resolve_bundle_root

    root = resolve_bundle_root(bundle)
    parser = read_bundle(root, overrides, initialize=False).parser
    if "train#dataset#data" not in parser:
        raise BundleError(f"bundle {root} has no train#dataset#data (the list of its training items)")

    def images() -> Iterator[SiteImage]:
        data = parser.get_parsed_content("train#dataset#data")
        steps = Compose([t for t in parser.get_parsed_content("train#preprocessing").flatten().transforms
                         if not isinstance(t, Randomizable)])
        for i, item in enumerate(data):
            where = f"{item.get('image')} (train#dataset#data[{i}] of bundle {root})"
            try:
                out = steps(dict(item))
            except Exception as e:  # one line naming the item, not MONAI's transform stack
                raise DatalistError(f"cannot preprocess {where}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
            image = np.asarray(out["image"], dtype=np.float64)
            classes = np.rint(np.asarray(out["label"], dtype=np.float64)[0]).astype(np.int64)
            yield where, image, classes, None

    return bundle_class_names(parser), images


#: the start of the line a site logs when it cannot compute its statistics (one line, naming the file)
SITE_FAILURE = "fedseg stats site failure: "


class SiteImageStatistics(Statistics):
    """NVFlare ``Statistics`` of one site's images and masks (module docstring).

    Args:
        site_datalists: JSON map ``{site: datalist}`` (``fedseg run --site-datalists``); None = the suite's other
            routes (:func:`fedseg.fl.site_data.resolve_site_datalist`: ``FEDSEG_DATALIST``, ``local/fedseg_site.json``,
            else built-in data of ``data_family``).
        split: the datalist split described (``training``: what the network trains on).
        intensity_bins, intensity_range: the shared intensity histogram's bins and ``[low, high]`` (the job's
            statistic config holds the same values; a pixel outside counts in ``outside_range_c{k}``); range None:
            the sites' min/max with NVFlare's noise (images without a fixed intensity scale, such as MR).
        data_family, data_root: built-in data when nothing else configures the site's datalist.
        min_images: a site with fewer images in the split offers no intensity statistic at all (the job's
            ``min_count``): NVFlare's minimum-count cleanser counts records, which for the intensity features are
            pixels, so it alone would let a site of two images send their intensity aggregates.
        bundle, bundle_overrides, site_overrides: a MONAI bundle (folder or the suite's bundle name) whose training
            images are described as its network sees them (:func:`bundle_images`), with ``bundle_overrides``
            ``{config id: value}`` at every site and this site's entry of the ``site_overrides`` file
            ``{site: {config id: value}}`` (``fedseg run --bundle --site-overrides``); the datalist routes are
            then not used and ``split`` must be ``training``.
    """

    def __init__(self, site_datalists: Optional[str] = None, split: str = "training",
                 intensity_bins: int = DEFAULT_INTENSITY_BINS, intensity_range: Optional[List[float]] = None,
                 data_family: str = "polyp", data_root: Optional[str] = None, min_images: int = 0,
                 bundle: Optional[str] = None, bundle_overrides: Optional[Dict[str, Any]] = None,
                 site_overrides: Optional[str] = None):
        super().__init__()
        self.bundle = bundle
        self.bundle_overrides = bundle_overrides  # as given: NVFlare writes the job's arguments from these fields
        self.site_overrides = site_overrides
        self.min_images = int(min_images)
        self.site_datalists = site_datalists
        self.split = split
        self.intensity_bins = int(intensity_bins)
        self.intensity_range = list(intensity_range) if intensity_range is not None else None
        self.data_family = data_family
        self.data_root = data_root
        self.datalist: Optional[str] = None
        self.columns: Optional[SiteColumns] = None
        #: the site's images again (histograms on bins the first pass did not compute); None: the datalist's split
        self.images: Optional[Callable[[], Iterator[SiteImage]]] = None
        #: why the site offers no feature (its log's one line), None when it computed its statistics
        self.failure: Optional[str] = None

    def initialize(self, fl_ctx: FLContext) -> None:
        """Every feature of the site's split in one pass. A site that cannot compute them (no datalist, an unreadable
        file) logs one line naming the cause and offers no feature: it answers the server's tasks with nothing, and
        the report names it as a site that sent nothing. Raising instead would end the site's NVFlare client after
        the server handed it the first task, and the server would wait for that task's result."""
        from fedseg.fl.site_data import resolve_site_datalist

        site = fl_ctx.get_identity_name()
        value_range = tuple(self.intensity_range) if self.intensity_range is not None else None
        try:
            if self.bundle:
                from fedseg.bundle import read_site_overrides

                if self.split != "training":
                    raise ValueError(f"a bundle's images are its training items, not the {self.split} split")
                overrides = {**(self.bundle_overrides or {}), **read_site_overrides(self.site_overrides, site)}
                class_names, self.images = bundle_images(self.bundle, overrides)
                self.columns = columns_of(self.images(), class_names, self.intensity_bins, value_range)
            else:
                self.datalist = str(resolve_site_datalist(site, {"data_family": self.data_family},
                                                          site_datalists=self.site_datalists, data_root=self.data_root))
                self.columns = compute_site_columns(self.datalist, self.split, self.intensity_bins, value_range)
        except Exception as e:  # one line in the site's log, naming the file; the server learns nothing of it
            self.failure = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.log_error(fl_ctx, f"{SITE_FAILURE}{site}: {self.failure}")
            self.columns = SiteColumns()

    def n_images(self) -> int:
        """The images of the site's split (every image adds one value to each image feature)."""
        return max((len(values) for values in self.columns.images.values()), default=0)

    def features(self) -> Dict[str, List[Feature]]:
        """The image features, and the intensity features where the split has at least ``min_images`` images."""
        pixels = list(self.columns.pixels) if self.n_images() >= self.min_images else []
        names = [*pixels, *self.columns.images]
        return {self.split: [Feature(name, DataType.FLOAT) for name in names]}

    def _values(self, feature: str) -> np.ndarray:
        return np.asarray(self.columns.images[feature], dtype=np.float64)

    def count(self, dataset_name: str, feature_name: str) -> int:
        if feature_name in self.columns.pixels:
            return self.columns.pixels[feature_name].count
        return len(self.columns.images[feature_name])

    def sum(self, dataset_name: str, feature_name: str) -> float:
        if feature_name in self.columns.pixels:
            return self.columns.pixels[feature_name].sum
        return float(self._values(feature_name).sum())

    def mean(self, dataset_name: str, feature_name: str) -> float:
        return self.sum(dataset_name, feature_name) / self.count(dataset_name, feature_name)

    def stddev(self, dataset_name: str, feature_name: str) -> float:
        """The sample standard deviation (``ddof=1``, NVFlare's global convention)."""
        n = self.count(dataset_name, feature_name)
        return float(np.sqrt(self.variance_with_mean(dataset_name, feature_name, self.mean(dataset_name, feature_name), n)))

    def variance_with_mean(self, dataset_name: str, feature_name: str, global_mean: float, global_count: float) -> float:
        """``sum((x - global_mean)^2) / (global_count - 1)`` over this site's records (NVFlare sums it over sites)."""
        if feature_name in self.columns.pixels:
            sq_dev = self.columns.pixels[feature_name].sq_dev(global_mean)
        else:
            sq_dev = float(np.square(self._values(feature_name) - global_mean).sum())
        return sq_dev / max(global_count - 1, 1)

    def min_value(self, dataset_name: str, feature_name: str) -> float:
        if feature_name in self.columns.pixels:
            return self.columns.pixels[feature_name].min
        return float(self._values(feature_name).min())

    def max_value(self, dataset_name: str, feature_name: str) -> float:
        if feature_name in self.columns.pixels:
            return self.columns.pixels[feature_name].max
        return float(self._values(feature_name).max())

    def histogram(self, dataset_name: str, feature_name: str, num_of_bins: int, global_min_value: float,
                  global_max_value: float) -> Histogram:
        counts = self._histogram_counts(feature_name, int(num_of_bins), float(global_min_value), float(global_max_value))
        edges = np.linspace(global_min_value, global_max_value, int(num_of_bins) + 1)
        bins = [Bin(float(edges[i]), float(edges[i + 1]), float(n)) for i, n in enumerate(counts)]
        return Histogram(HistogramType.STANDARD, bins)

    def _histogram_counts(self, feature: str, bins: int, low: float, high: float) -> np.ndarray:
        if feature in self.columns.images:
            return pixel_histogram(self._values(feature), bins, low, high)
        key = (feature, bins, low, high)
        if key not in self.columns.histograms:
            if not feature.startswith(INTENSITY):  # a 0/1 column: its histogram from its sum alone
                column = self.columns.pixels[feature]
                ones = round(column.sum)
                weights = np.asarray([column.count - ones, ones], dtype=np.float64)
                return np.histogram([0.0, 1.0], bins=bins, range=(low, high), weights=weights)[0].astype(np.int64)
            k = int(feature[len(INTENSITY):])
            total = np.zeros(bins, dtype=np.int64)
            for _, image, _, _ in self.images() if self.images else datalist_images(self.datalist, self.split):
                total += pixel_histogram(image[k].ravel(), bins, low, high)
            self.columns.histograms[key] = total
        return self.columns.histograms[key]

