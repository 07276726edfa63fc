"""The engine's resident training data and batched validation against the per-sample loader path.

* same images: an epoch of resident batches holds every training image once, with the values the cached
  ``DataLoader`` path gives, in ``randperm`` order of the engine's shuffle generator;
* same augmentation: every augmented sample is one of the flips / 90-degree turns of its own source image, with
  its label moved alike (the distribution itself is checked against MONAI in ``test_batch_transforms.py``);
* same validation scores for a fixed model: ``validation_metrics`` (batched on the device) equals ``evaluate`` image
  by image;
* a new data order every round on both paths (MONAI's DataLoader reset its generator, replaying round 0's order).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from fedseg.engine import SegEngine
from fedseg.engine.resident import ResidentLoader
from fedseg.objectives.base import ClientObjective, RoundContext


def _engine(datalist, cfg, **overrides):
    return SegEngine("site-a", datalist, {**cfg, **overrides})


def _cached(engine, key):
    dataset = engine._dataset("training", True)
    return [torch.Tensor(torch.as_tensor(it[key])).float() for it in dataset._cache]  # plain tensors, no metadata


def _dihedral(x):
    out = []
    for f0, f1, k in itertools.product((0, 1), (0, 1), range(4)):
        y = x.flip(1) if f0 else x
        y = y.flip(2) if f1 else y
        out.append(torch.rot90(y, k, (1, 2)))
    return out


def test_resident_epoch_holds_the_loader_images_in_the_shuffled_order(tiny_datalist, tiny_train_config):
    engine = _engine(tiny_datalist, tiny_train_config, augment=False)
    batches = engine.training_batches()
    assert isinstance(batches, ResidentLoader)
    state = engine.shuffle_generator.get_state()
    images = torch.cat([b["image"] for b in batches])
    order = torch.randperm(engine.n_train, generator=torch.Generator().set_state(state))
    cached = _cached(engine, "image")
    assert torch.equal(images, torch.stack([cached[i] for i in order]))
    # the per-sample loader gives the same images (its own order)
    loader = _engine(tiny_datalist, tiny_train_config, augment=False, resident_data=False).training_batches()
    assert not isinstance(loader, ResidentLoader)
    from_loader = torch.cat([b["image"] for b in loader])
    key = lambda t: t.sum().item()  # noqa: E731
    assert sorted(map(key, from_loader)) == pytest.approx(sorted(map(key, images)))


def test_every_augmented_sample_is_a_flip_or_turn_of_its_source(tiny_datalist, tiny_train_config):
    engine = _engine(tiny_datalist, tiny_train_config, augment=True, augment_level="basic")
    cached_images, cached_labels = _cached(engine, "image"), _cached(engine, "label")
    state = engine.shuffle_generator.get_state()
    order = torch.randperm(engine.n_train, generator=torch.Generator().set_state(state))
    batch_size = int(engine.train_config["batch_size"])
    moved = 0
    for b, batch in enumerate(engine.training_batches()):
        for j, (image, label) in enumerate(zip(batch["image"], batch["label"])):
            source = int(order[b * batch_size + j])
            images, labels = _dihedral(cached_images[source]), _dihedral(cached_labels[source])
            match = [k for k, y in enumerate(images) if torch.equal(y, image)]
            assert match, "not a flip or turn of its source image"
            assert any(torch.equal(labels[k], label) for k in match)  # the label moved with it
            moved += not torch.equal(image, cached_images[source])
    assert moved > 0


def test_each_round_draws_a_new_order_on_both_paths(tiny_datalist, tiny_train_config):
    for resident in (True, False):
        engine = _engine(tiny_datalist, tiny_train_config, augment=False, resident_data=resident)
        first = torch.cat([b["image"] for b in engine.training_batches()])
        second = torch.cat([b["image"] for b in engine.training_batches()])  # the next round's loader
        assert first.shape == second.shape and not torch.equal(first, second), resident


@pytest.mark.parametrize("split", ["validation", "test"])
def test_batched_validation_scores_equal_image_by_image(tiny_datalist, tiny_train_config, split):
    engine = _engine(tiny_datalist, tiny_train_config)
    model = engine.build_network()
    engine.train(model, ClientObjective(), RoundContext("site-a", 0, 1))  # a model that predicts something
    batched = engine.evaluation.batched_dice(model, split)
    one_by_one = engine.evaluate(model, split, metrics=("dice",), largest_component=False)["dice"]
    assert batched == pytest.approx(one_by_one, abs=1e-6)
    if split == "validation":
        assert engine.validation_metrics(model)["val_dice"] == pytest.approx(one_by_one, abs=1e-6)


def test_patch_mode_batches_carry_their_image_statistics(tiny_datalist, tiny_train_config):
    engine = _engine(tiny_datalist, tiny_train_config, spatial_mode="patch")
    batch = next(iter(engine.training_batches()))
    k, p = int(engine.train_config["patch_samples"]), int(engine.train_config["patch_size"])
    n = min(int(engine.train_config["batch_size"]), engine.n_train) * k
    assert batch["image"].shape == (n, 3, p, p) and batch["label"].shape == (n, 1, p, p)
    assert batch["image_mean"].shape == (n, 3) and batch["image_std"].shape == (n, 3)
    # each image's patches carry that image's statistics (ChannelStatisticsd before the crop)
    assert torch.equal(batch["image_mean"][0], batch["image_mean"][k - 1])
    metrics = engine.train(engine.build_network(), ClientObjective(), RoundContext("site-a", 0, 1))
    assert metrics["steps"] > 0


def test_a_site_beyond_the_memory_cache_keeps_the_loader(tiny_datalist, tiny_train_config):
    engine = _engine(tiny_datalist, tiny_train_config, cache_max_mb=0.001)
    assert not isinstance(engine.training_batches(), ResidentLoader)


@pytest.mark.parametrize("mode, patch_dims", [("patch", 3), ("slices", 2)])
def test_volume_patches_come_from_the_resident_split(tmp_path_factory, tiny_train_config, mode, patch_dims):
    """CT / MR volumes whose cache fits: 3-D patches, or one-slice patches squeezed to 2-D, drawn on the device the
    same way (the volume bundle's croppers, flips and turns have their batch forms)."""
    from fedseg.data.synthetic import generate_site_data
    from fedseg.engine.factory import build_engine
    from sim_utils import VOLUME_FIELDS

    datalist = generate_site_data("prostate3d", "site-a", tmp_path_factory.mktemp("volumes"), profile="tiny")
    engine = build_engine("site-a", datalist, {**tiny_train_config, **VOLUME_FIELDS, "spatial_mode": mode})
    batches = engine.training_batches()
    assert isinstance(batches, ResidentLoader)
    batch = next(iter(batches))
    assert batch["image"].ndim == patch_dims + 2 and batch["label"].shape[1] == 1
    assert set(torch.unique(batch["label"]).tolist()) <= set(range(engine.num_classes))
    assert engine.train(engine.build_network(), ClientObjective(), RoundContext("site-a", 0, 1))["steps"] > 0
