"""What every importer shares (fedseg.data.importers.common): the manifest, the files it lists, seeded group splits."""

from __future__ import annotations

import numpy as np
import pytest

from fedseg.data import DatalistError
from fedseg.data.importers.common import check_sources, read_manifest, split_groups, stable_rng
from fedseg.data.importers.retina import retina_subject


def test_stable_rng_repeats_for_the_same_parts_only():
    first = stable_rng("retina", "DRIVE", 0).permutation(50)
    assert np.array_equal(first, stable_rng("retina", "DRIVE", 0).permutation(50))
    assert np.array_equal(first, stable_rng("retina", "DRIVE", "0").permutation(50))  # parts are joined as text
    assert not np.array_equal(first, stable_rng("retina", "DRIVE", 1).permutation(50))
    assert not np.array_equal(first, stable_rng("retina", "STARE", 0).permutation(50))


def test_split_groups_partitions_the_keys_with_the_stated_counts():
    groups = [f"g{i:02d}" for i in range(20)]
    out = split_groups(groups, stable_rng("t", 0), {"validation": 0.1, "test": 0.22}, ("training", "validation", "test"))
    # max(1, round(f * n)): 2 validation, round(4.4) = 4 test, the rest training
    assert {k: len(v) for k, v in out.items()} == {"validation": 2, "test": 4, "training": 14}
    assert sorted(sum(out.values(), [])) == groups
    # a small fraction still gets one group
    assert len(split_groups(groups[:3], stable_rng("t", 0), {"test": 0.01}, ("training", "test"))["test"]) == 1
    with pytest.raises(DatalistError, match="too few subjects"):
        split_groups(groups[:2], stable_rng("t", 0), {"validation": 0.1, "test": 0.1}, ("training", "validation", "test"))


def test_read_manifest_and_check_sources_name_what_is_wrong(tmp_path):
    with pytest.raises(DatalistError, match="demo manifest not found"):
        read_manifest(tmp_path, ("site", "id"), "demo")
    (tmp_path / "manifest.csv").write_text("site,id,image,mask\nA, 1 ,a.png,\n")
    with pytest.raises(DatalistError, match=r"lacks column\(s\) \['split'\]"):
        read_manifest(tmp_path, ("site", "split"), "demo")
    rows = read_manifest(tmp_path, ("site", "id", "image", "mask"), "demo")
    assert rows == [{"site": "A", "id": "1", "image": "a.png", "mask": ""}]  # cells stripped, empty ones ""
    with pytest.raises(DatalistError, match="row A/1 has no mask"):
        check_sources(rows, tmp_path, tmp_path / "manifest.csv")
    rows = [{"site": "A", "id": str(i), "image": f"i{i}.png", "mask": f"m{i}.png"} for i in range(4)]
    (tmp_path / "i0.png").write_bytes(b"")
    (tmp_path / "m0.png").write_bytes(b"")
    with pytest.raises(DatalistError, match=r"^6 file\(s\) listed in .* are missing: .*i1\.png, .*m1\.png, .* and 1 more$"):
        check_sources(rows, tmp_path, tmp_path / "manifest.csv")
    check_sources(rows[:1], tmp_path, tmp_path / "manifest.csv")  # present files pass


def test_retina_subject_pairs_the_two_eyes_of_one_child():
    assert retina_subject("Image_01L") == retina_subject("Image_01R") == "Image_01"
    assert retina_subject("21_training") == "21_training"
    assert retina_subject("im0001") == "im0001"
    assert retina_subject("LR") == "LR"  # no digit before the eye letter: its own subject
