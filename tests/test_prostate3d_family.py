"""Built-in ``prostate3d`` family: NIfTI geometry (spacing, orientation, affine), anatomy in world coordinates (organ
size in mm whatever the voxel size, PZ behind the TZ in RAS), per-site differences, determinism and reuse, the datalist.

Independent references: nibabel reads the headers back (``voxel_sizes``, ``aff2axcodes``, ``as_closest_canonical``),
scipy counts connected pieces, the Rician noise is measured from the voxels, and MONAI's own ``Orientationd`` /
``Spacingd`` resample one volume per site to the declared target spacing.
"""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage

from fedseg.data.datalist import load_datalist
from fedseg.data.labels import LabelSpace
from fedseg.data.synthetic import generate_federation
from fedseg.data.synthetic.volumes import (
    FOV_BAND_MM,
    ORGAN_WIDTH_BAND_MM,
    ORIENTATIONS,
    VOLUME_FAMILIES,
    VOLUME_PROFILES,
    generate_volume_site,
    volume_family_fields,
    volume_family_label_space,
)

SITES = ["site-1", "site-2", "site-3"]
SPLITS = ("training", "validation", "test")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return generate_federation("prostate3d", SITES, tmp_path_factory.mktemp("p3d_tiny"), profile="tiny")


@pytest.fixture(scope="module")
def default3(tmp_path_factory):
    """The default profile's clinical spacings, three volumes a site (the site's draws do not depend on the count)."""
    root = tmp_path_factory.mktemp("p3d_default")
    return generate_federation("prostate3d", SITES, root, profile="default", num_images=3)


def _data(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def _entries(path: Path):
    data = _data(path)
    return [e for s in SPLITS for e in data[s]]


def _canonical(path: Path, entry: dict):
    """(image, label, voxel sizes) in RAS voxel order, reoriented by nibabel from the stored files."""
    image = nib.as_closest_canonical(nib.load(path.parent / entry["image"]))
    label = nib.as_closest_canonical(nib.load(path.parent / entry["label"]))
    assert np.allclose(image.affine, label.affine)
    return np.asarray(image.dataobj, np.float64), np.asarray(label.dataobj), np.asarray(label.header.get_zooms())


def _federations(tiny, default3):
    return {"tiny": tiny, "default": default3}


# ----------------------------------------------------------------------------------------------
# datalist
# ----------------------------------------------------------------------------------------------


def test_datalist_declares_the_label_space_and_the_volume_fields(tiny, default3):
    for profile, fed in _federations(tiny, default3).items():
        for path in fed.values():
            data = _data(path)
            assert data["labels"] == {"background": 0, "pz": 1, "tz": 2}
            assert data["regions"] == {"prostate": ["pz", "tz"], "pz": ["pz"], "tz": ["tz"]}
            assert "label_values" not in data  # the label volumes store class indices
            assert data["spatial_dims"] == 3 and data["modality"] == "MR"
            # one target spacing for the whole family (per profile): every site is resampled to it
            assert data["target_spacing"] == list(VOLUME_PROFILES[profile]["target_spacing"])
            # the family-level fields are known without generating anything (what a job checks up front)
            fields = volume_family_fields("prostate3d", profile)
            assert {k: data[k] for k in fields} == fields
            loaded = load_datalist(path, check_files=False)
            assert sum(len(v) for v in loaded.values()) == data["num_volumes"]
            assert all(Path(e["image"]).name.endswith(".nii.gz") for v in loaded.values() for e in v)
    lo, hi = VOLUME_PROFILES["tiny"]["num_volumes"]
    assert all(lo <= _data(p)["num_volumes"] <= hi for p in tiny.values())
    space = LabelSpace.from_datalist(_data(tiny["site-1"]), "prostate3d")
    assert space.names == ("background", "pz", "tz")
    assert space.region_indices() == {"prostate": (1, 2), "pz": (1,), "tz": (2,)}


def test_volume_family_label_space_is_the_datalists_and_a_copy():
    space = volume_family_label_space("prostate3d")
    assert space == {
        "labels": {"background": 0, "pz": 1, "tz": 2},
        "regions": {"prostate": ["pz", "tz"], "pz": ["pz"], "tz": ["tz"]},
    }
    space["regions"]["prostate"].append("x")
    assert volume_family_label_space("prostate3d")["regions"]["prostate"] == ["pz", "tz"]
    assert VOLUME_FAMILIES == ("prostate3d",)
    with pytest.raises(ValueError, match="brain3d"):
        volume_family_label_space("brain3d")
    with pytest.raises(ValueError, match="huge"):
        volume_family_fields("prostate3d", "huge")
    assert volume_family_fields("prostate3d", "paper")["target_spacing"] == [0.5, 0.5, 1.5]


# ----------------------------------------------------------------------------------------------
# NIfTI geometry
# ----------------------------------------------------------------------------------------------


def test_headers_carry_the_sites_spacing_orientation_and_a_shared_affine(tiny, default3):
    orientations = set()
    for profile, fed in _federations(tiny, default3).items():
        prof = VOLUME_PROFILES[profile]
        for path in fed.values():
            geometry = _data(path)["geometry"]
            orientations.add(geometry["orientation"])
            assert geometry["orientation"] in ORIENTATIONS
            # in RAS axis order the drawn spacing is anisotropic and in the profile's bands
            sx, sy, sz = geometry["spacing_ras"]
            assert sx == sy and prof["inplane_spacing"][0] <= sx <= prof["inplane_spacing"][1]
            assert prof["slice_thickness"][0] <= sz <= prof["slice_thickness"][1]
            for entry in _entries(path):
                image = nib.load(path.parent / entry["image"])
                label = nib.load(path.parent / entry["label"])
                assert image.get_data_dtype() == np.float32 and label.get_data_dtype() == np.uint8
                assert image.shape == label.shape == tuple(geometry["shape"])
                np.testing.assert_array_equal(image.affine, label.affine)
                np.testing.assert_allclose(nib.affines.voxel_sizes(image.affine), geometry["spacing"], atol=1e-4)
                np.testing.assert_allclose(image.header.get_zooms(), geometry["spacing"], atol=1e-4)
                assert "".join(nib.aff2axcodes(image.affine)) == geometry["orientation"]
                assert int(image.header["sform_code"]) == 1 and int(image.header["qform_code"]) == 1
                np.testing.assert_allclose(image.header.get_qform(), image.affine, atol=1e-4)
                # stored voxel sizes are the RAS spacing permuted into the stored axis order
                assert sorted(geometry["spacing"]) == pytest.approx(sorted(geometry["spacing_ras"]))
    # the default sites do not all store RAS: the pipeline's Orientationd has work to do
    assert orientations - {"RAS"}


def test_sites_differ_in_spacing_and_shape(default3):
    geometries = [_data(p)["geometry"] for p in default3.values()]
    spacings = [tuple(g["spacing_ras"]) for g in geometries]
    shapes = [tuple(g["shape"]) for g in geometries]
    assert len(set(spacings)) == len(spacings) and len(set(shapes)) == len(shapes)
    # the slice thicknesses of the default sites span a clinically meaningful range (thin vs thick slices)
    assert max(s[2] for s in spacings) / min(s[2] for s in spacings) > 1.3


# ----------------------------------------------------------------------------------------------
# anatomy in world coordinates
# ----------------------------------------------------------------------------------------------


def test_organ_size_is_physical_whatever_the_voxel_size(tiny, default3):
    """Left-right width from voxel counts x spacing lies in the site's declared range (within one voxel) and the
    family band, and the FOV is the declared physical extent, for 1-2 mm and 0.4-0.8 mm voxels alike."""
    band_lo, band_hi = ORGAN_WIDTH_BAND_MM
    for fed in _federations(tiny, default3).values():
        for path in fed.values():
            data = _data(path)
            lo, hi = data["anatomy"]["organ_width_mm"]
            assert band_lo <= lo <= hi <= band_hi
            for entry in _entries(path):
                _, label, zooms = _canonical(path, entry)
                fov = np.asarray(label.shape) * zooms
                assert FOV_BAND_MM["inplane"][0] - zooms[0] <= fov[0] <= FOV_BAND_MM["inplane"][1] + zooms[0]
                assert FOV_BAND_MM["through_plane"][0] - zooms[2] <= fov[2] <= FOV_BAND_MM["through_plane"][1] + zooms[2]
                xs = np.flatnonzero((label > 0).any(axis=(1, 2)))
                width = len(xs) * zooms[0]
                assert lo - zooms[0] <= width <= hi + zooms[0], (path, entry, width, (lo, hi))
                # the organ never touches the FOV border
                assert 0 < xs[0] and xs[-1] < label.shape[0] - 1


def test_the_same_organ_has_the_same_volume_in_mm3_on_coarse_and_fine_grids(tiny, default3):
    """A site's anatomy and volume i's organ do not depend on the profile, only the voxel grid does: the organ's
    volume from voxel counts x voxel volume agrees between the tiny (coarse) and default (fine) grids."""
    for site in SITES:
        coarse, fine = tiny[site], default3[site]
        assert _data(coarse)["anatomy"] == _data(fine)["anatomy"]
        names = [f"{i:03d}.nii.gz" for i in range(3)]
        for name in names:
            entry = {"image": f"images/{name}", "label": f"labels/{name}"}
            volumes = []
            for path in (coarse, fine):
                _, label, zooms = _canonical(path, entry)
                volumes.append([(label == k).sum() * np.prod(zooms) for k in (1, 2)] + [(label > 0).sum() * np.prod(zooms)])
            (pz_c, tz_c, all_c), (pz_f, tz_f, all_f) = volumes
            assert all_c == pytest.approx(all_f, rel=0.12), (site, name)
            assert tz_c == pytest.approx(tz_f, rel=0.2) and pz_c == pytest.approx(pz_f, rel=0.25), (site, name)


def test_zones_in_ras_pz_posterior_horseshoe_tz_towards_the_base(tiny, default3):
    """After nibabel's reorientation to RAS, in every volume of every site (whatever its stored orientation): both
    zones present, each one connected piece; the PZ centroid lies posterior (-y) to the TZ centroid and inferior
    (-z, the apex) to it; on the midline of the widest slice the gland's posterior edge is PZ, its anterior edge TZ."""
    for fed in _federations(tiny, default3).values():
        for path in fed.values():
            for entry in _entries(path):
                _, label, zooms = _canonical(path, entry)
                assert set(np.unique(label).tolist()) == {0, 1, 2}
                assert [ndimage.label(m)[1] for m in (label > 0, label == 1, label == 2)] == [1, 1, 1]
                pz = (np.argwhere(label == 1) * zooms).mean(axis=0)
                tz = (np.argwhere(label == 2) * zooms).mean(axis=0)
                assert tz[1] - pz[1] > 2.0, (path, entry)  # mm: PZ is posterior
                assert tz[2] - pz[2] > 0.3, (path, entry)  # mm: PZ dominates the apex
                organ = label > 0
                z = int(np.argmax(organ.sum(axis=(0, 1))))
                x = int(round(np.argwhere(organ)[:, 0].mean()))
                column = label[x, :, z]
                inside = np.flatnonzero(column)
                assert column[inside[0]] == 1 and column[inside[-1]] == 2


def test_the_image_shows_the_rectum_behind_the_gland(tiny):
    """Image and label agree in world space: in RAS, the 10 mm right behind the gland's midline (the rectal wall and
    lumen) are darker than the PZ in front of them (at sites without an endorectal coil, whose near field makes the
    rectal wall the brightest tissue); and the whole gland, apex to base, lies inside the stack."""
    checked = 0
    for path in tiny.values():
        coil = _data(path)["style"]["endorectal_coil"]
        for entry in _entries(path):
            image, label, zooms = _canonical(path, entry)
            organ = np.argwhere(label > 0)
            assert organ[:, 2].min() > 0 and organ[:, 2].max() < label.shape[2] - 1
            z = int(np.argmax((label > 0).sum(axis=(0, 1))))
            x = int(round(organ[:, 0].mean()))
            y_back = np.flatnonzero(label[x, :, z])[0]
            behind = image[x - 1 : x + 2, max(0, y_back - int(round(10 / zooms[1]))) : y_back, z]
            if not coil:
                assert behind.mean() < image[label == 1].mean()
                checked += 1
    assert checked


# ----------------------------------------------------------------------------------------------
# intensities
# ----------------------------------------------------------------------------------------------


def test_sites_differ_in_intensity_inside_the_organ_and_pz_is_brighter(default3):
    """Per site, statistics of the voxels inside the gland: median (gain and offset), PZ/TZ mean ratio (zone
    contrast), coefficient of variation (bias, heterogeneity, noise), relative noise (robust std of neighbour
    differences / median). Every pair of sites differs by >= 15 % in at
    least one of them; the PZ is brighter than the TZ in every volume (T2)."""
    stats = {}
    for site, path in default3.items():
        rows = []
        for entry in _entries(path):
            image, label, _ = _canonical(path, entry)
            assert image.min() >= 0.0  # MR magnitude
            organ = image[label > 0]
            pz, tz = image[label == 1].mean(), image[label == 2].mean()
            assert pz > tz
            inside = (label[1:] > 0) & (label[:-1] > 0)
            noise = np.median(np.abs(np.diff(image, axis=0)[inside])) / 0.6745 / np.sqrt(2.0)
            rows.append([np.median(organ), pz / tz, organ.std() / organ.mean(), noise / np.median(organ)])
        stats[site] = np.mean(rows, axis=0)
    pairs = [(a, b) for i, a in enumerate(SITES) for b in SITES[i + 1 :]]
    for a, b in pairs:
        assert np.abs(np.log(stats[a] / stats[b])).max() > np.log(1.15), (a, b, stats)


def test_measured_noise_matches_the_sites_rician_sigma(default3):
    """At high SNR Rician noise is Gaussian with the declared sigma (noise_sigma x gain): the robust std of in-plane
    neighbour differences / sqrt(2) recovers it (smooth texture adds a little on 0.4-0.8 mm voxels)."""
    for path in default3.values():
        style = _data(path)["style"]
        image, _, _ = _canonical(path, _entries(path)[0])
        diffs = np.diff(image, axis=0)
        sigma = np.median(np.abs(diffs)) / 0.6745 / np.sqrt(2.0)
        assert 0.9 <= sigma / (style["noise_sigma"] * style["gain"]) <= 1.3


def test_monai_resamples_every_site_to_the_target_spacing_with_both_zones(tiny):
    """MONAI's Orientationd + Spacingd (the pipeline's loading) put every site on the family's grid: RAS, the target
    spacing, an in-plane size in the tiny profile's band, both zones kept by nearest-neighbour resampling."""
    from monai.transforms import Compose, EnsureChannelFirstd, LoadImaged, Orientationd, Spacingd

    target = VOLUME_PROFILES["tiny"]["target_spacing"]
    load = Compose(
        [
            LoadImaged(["image", "label"], image_only=False),
            EnsureChannelFirstd(["image", "label"]),
            Orientationd(["image", "label"], axcodes="RAS", labels=(("L", "R"), ("P", "A"), ("I", "S"))),
            Spacingd(["image", "label"], pixdim=target, mode=("bilinear", "nearest")),
        ]
    )
    for path in tiny.values():
        entry = _entries(path)[0]
        out = load({k: str(path.parent / entry[k]) for k in ("image", "label")})
        assert "".join(nib.aff2axcodes(np.asarray(out["image"].affine))) == "RAS"
        np.testing.assert_allclose(nib.affines.voxel_sizes(np.asarray(out["image"].affine)), target, atol=1e-4)
        assert all(23 <= n <= 33 for n in out["image"].shape[1:3]), out["image"].shape
        assert set(np.unique(out["label"].numpy()).tolist()) == {0.0, 1.0, 2.0}


# ----------------------------------------------------------------------------------------------
# determinism, reuse, bad input
# ----------------------------------------------------------------------------------------------


def _files(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_arguments_give_byte_identical_files_and_volume_i_does_not_depend_on_the_count(tmp_path):
    a = generate_volume_site("prostate3d", "h", tmp_path / "a", profile="tiny", num_volumes=4)
    b = generate_volume_site("prostate3d", "h", tmp_path / "b", profile="tiny", num_volumes=4)
    assert _files(a.parent) == _files(b.parent)
    c = generate_volume_site("prostate3d", "h", tmp_path / "c", profile="tiny", num_volumes=3)
    fa, fc = _files(a.parent), _files(c.parent)
    volumes_c = {k: v for k, v in fc.items() if k.name.endswith(".nii.gz")}
    assert len(volumes_c) == 6 and all(fa[k] == v for k, v in volumes_c.items())
    d = generate_volume_site("prostate3d", "h", tmp_path / "d", seed=1, profile="tiny", num_volumes=3)
    assert _files(d.parent)[Path("images/000.nii.gz")] != fc[Path("images/000.nii.gz")]


def test_second_call_reuses_and_a_changed_call_rewrites(tmp_path):
    path = generate_volume_site("prostate3d", "h", tmp_path, profile="tiny", num_volumes=4)
    stamps = {p: p.stat().st_mtime_ns for p in path.parent.rglob("*") if p.is_file()}
    assert generate_volume_site("prostate3d", "h", tmp_path, profile="tiny", num_volumes=4) == path
    assert {p: p.stat().st_mtime_ns for p in path.parent.rglob("*") if p.is_file()} == stamps
    # a missing volume is regenerated
    (path.parent / "labels" / "002.nii.gz").unlink()
    generate_volume_site("prostate3d", "h", tmp_path, profile="tiny", num_volumes=4)
    assert (path.parent / "labels" / "002.nii.gz").is_file()
    # fewer volumes: the leftovers of the larger generation go, the datalist lists exactly the files present
    generate_volume_site("prostate3d", "h", tmp_path, profile="tiny", num_volumes=3)
    assert sorted(p.name for p in (path.parent / "images").iterdir()) == ["000.nii.gz", "001.nii.gz", "002.nii.gz"]
    assert sorted(e["image"] for e in _entries(path)) == [f"images/00{i}.nii.gz" for i in range(3)]
    assert not list(path.parent.rglob("*.tmp"))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"family": "brain3d"}, "brain3d"),
        ({"profile": "huge"}, "huge"),
        ({"site": "a/b"}, "a/b"),
        ({"num_volumes": 2}, "num_volumes"),
        ({"num_volumes": 3.5}, "num_volumes"),
        ({"split_fractions": (0.5, 0.5, 0.5)}, "split_fractions"),
    ],
)
def test_bad_arguments_name_the_offending_value(tmp_path, kwargs, match):
    args = {"family": "prostate3d", "site": "h", "out_dir": tmp_path, "profile": "tiny", **kwargs}
    with pytest.raises(ValueError, match=match):
        generate_volume_site(**args)
    assert not list(tmp_path.rglob("*.nii.gz"))
