"""The classification engine (FedEFM phase 1): datalist checks, transforms, metrics against hand counts,
a tiny ViT learning two obviously different classes, FedEFM's token features, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from fedseg.data.datalist import DatalistError
from fedseg.objectives.base import ClientObjective, RoundContext

#: tiny ViT at 32 px: 2 x 2 patch tokens of width 96, 4 blocks; a few CPU seconds per epoch
CONFIG = {
    "vit_profile": "tiny",
    "vit_image_size": 32,
    "in_channels": 1,
    "num_classes": 2,
    "batch_size": 4,
    "learning_rate": 1e-3,
    "local_epochs": 1,
    "seed": 0,
    "augment": True,
}
LABEL_SPACE = ["xray/dark", "xray/bright"]


def _image(label: int, rng: np.random.Generator, size: int = 40, rgb: bool = False) -> np.ndarray:
    """Class 0: dark with noise; class 1: bright with noise — separable by mean intensity alone."""
    base = 40.0 if label == 0 else 210.0
    img = np.clip(base + rng.normal(0, 12, (size, size)), 0, 255).astype(np.uint8)
    return np.stack([img] * 3, -1) if rgb else img


def write_classification_datalist(folder: Path, n_per_class=(6, 2, 3), label_space=LABEL_SPACE, seed: int = 0) -> Path:
    """A classification datalist with ``n_per_class`` images per class for training/validation/test;
    paths relative to the datalist's folder (as the data helpers write them)."""
    rng = np.random.default_rng(seed)
    (folder / "img").mkdir(parents=True, exist_ok=True)
    data = {"task": "classification", "label_space": list(label_space)}
    for split, n in zip(("training", "validation", "test"), n_per_class):
        entries = []
        for label in range(2):
            for i in range(n):
                name = f"img/{split}_{label}_{i}.png"
                Image.fromarray(_image(label, rng, rgb=(i % 2 == 1))).save(folder / name)
                entries.append({"image": name, "label": label})
        data[split] = entries
    path = folder / "datalist.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def cls_datalist(tmp_path_factory):
    return write_classification_datalist(tmp_path_factory.mktemp("cls"))


def _engine(datalist, **overrides):
    from fedseg.engine.classification import ClassificationEngine

    return ClassificationEngine("site-a", datalist, {**CONFIG, **overrides}, device=torch.device("cpu"))


# ------------------------------------------------------------------------------------------ metrics
def test_metrics_match_hand_counts():
    from fedseg.engine.classification import classification_metrics

    # class 0: 3 images, 2 right; class 1: 1 image, wrong; class 2: 2 images, both right; class 3 absent
    labels = [0, 0, 0, 1, 2, 2]
    preds = [0, 0, 1, 0, 2, 2]
    m = classification_metrics(preds, labels, num_classes=4)
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["accuracy_class_0"] == pytest.approx(2 / 3)
    assert m["accuracy_class_1"] == 0.0
    assert m["accuracy_class_2"] == 1.0
    assert "accuracy_class_3" not in m  # no image of class 3: undefined, not 0
    assert m["balanced_accuracy"] == pytest.approx((2 / 3 + 0 + 1) / 3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=40))
def test_metrics_against_brute_force(pairs):
    """Accuracy and balanced accuracy recomputed from a confusion matrix built by brute force."""
    from fedseg.engine.classification import classification_metrics

    preds, labels = [p for p, _ in pairs], [y for _, y in pairs]
    confusion = np.zeros((5, 5), dtype=int)
    for p, y in pairs:
        confusion[y, p] += 1
    present = [k for k in range(5) if confusion[k].sum()]
    m = classification_metrics(preds, labels, num_classes=5)
    assert m["accuracy"] == pytest.approx(np.trace(confusion) / len(pairs))
    recalls = [confusion[k, k] / confusion[k].sum() for k in present]
    assert m["balanced_accuracy"] == pytest.approx(float(np.mean(recalls)))
    assert sorted(k for k in m if k.startswith("accuracy_class_")) == sorted(f"accuracy_class_{k}" for k in present)


def test_metrics_bad_input():
    from fedseg.engine.classification import classification_metrics

    with pytest.raises(ValueError, match="outside"):
        classification_metrics([0], [3], num_classes=2)
    with pytest.raises(ValueError, match="predictions for"):
        classification_metrics([0, 1], [0], num_classes=2)


# --------------------------------------------------------------------------------------------- data
def test_loader_shapes_and_ranges(cls_datalist):
    engine = _engine(cls_datalist)
    batch = next(iter(engine.loader("training", train=True)))
    assert batch["image"].shape == (4, 1, 32, 32) and batch["image"].dtype == torch.float32
    assert batch["label"].shape == (4,) and batch["label"].dtype == torch.int64
    assert 0.0 <= float(batch["image"].min()) and float(batch["image"].max()) <= 1.0
    assert engine.n_train == 12 and engine.label_space == LABEL_SPACE


def test_rgb_and_grey_agree(tmp_path):
    """An RGB image with equal channels becomes the same 1-channel tensor as its grey version."""
    from fedseg.data.classification_transforms import classification_transforms

    grey = (np.arange(48 * 48).reshape(48, 48) % 251).astype(np.uint8)
    Image.fromarray(grey).save(tmp_path / "g.png")
    Image.fromarray(np.stack([grey] * 3, -1)).save(tmp_path / "c.png")
    t = classification_transforms(48, in_channels=1)
    a, b = t({"image": str(tmp_path / "g.png"), "label": 0}), t({"image": str(tmp_path / "c.png"), "label": 0})
    assert a["image"].shape == (1, 48, 48)
    torch.testing.assert_close(a["image"], b["image"])
    torch.testing.assert_close(a["image"][0], torch.as_tensor(grey, dtype=torch.float32).T / 255.0)


def _write(tmp_path, data):
    path = tmp_path / "datalist.json"
    path.write_text(json.dumps(data))
    return path


def test_label_outside_label_space_is_refused(tmp_path, cls_datalist):
    data = json.loads(Path(cls_datalist).read_text())
    for entry in data["training"]:
        entry["image"] = str(Path(cls_datalist).parent / entry["image"])
    for split in ("validation", "test"):
        for entry in data[split]:
            entry["image"] = str(Path(cls_datalist).parent / entry["image"])
    data["training"][3]["label"] = 2
    with pytest.raises(DatalistError, match=r"training\[3\].*label 2 outside the label space 0..1"):
        _engine(_write(tmp_path, data))
    data["training"][3]["label"] = True
    with pytest.raises(DatalistError, match="integer 'label'"):
        _engine(_write(tmp_path, data))
    data["training"][3]["label"] = 1
    data["label_space"] = ["a", "a"]
    with pytest.raises(DatalistError, match="twice"):
        _engine(_write(tmp_path, data))
    data["label_space"] = LABEL_SPACE
    data["task"] = "segmentation"
    with pytest.raises(DatalistError, match="not a classification datalist"):
        _engine(_write(tmp_path, data))


def test_num_classes_mismatch_is_refused(cls_datalist):
    with pytest.raises(ValueError, match=r"num_classes=5 .* 2 classes"):
        _engine(cls_datalist, num_classes=5)


def test_dp_is_refused(cls_datalist):
    with pytest.raises(ValueError, match="differential privacy .* not supported by the classification engine"):
        _engine(cls_datalist, dp_target_epsilon=8.0)


# ------------------------------------------------------------------------------------------ training
def test_tiny_vit_learns_two_obvious_classes(cls_datalist):
    engine = _engine(cls_datalist)
    model = engine.build_network()
    assert model.num_classes == 2 and model.in_channels == 1
    objective = ClientObjective()
    before = engine.evaluate(model, "training")["accuracy"]
    losses = [engine.train(model, objective, RoundContext("site-a", r, 6))["train_loss"] for r in range(6)]
    after = engine.evaluate(model, "training")["accuracy"]
    assert losses[-1] < losses[0]
    assert after > before and after >= 0.9
    metrics, rows = engine.evaluate(model, "test", per_image=True)
    assert metrics["accuracy"] >= 0.8
    assert [r["id"] for r in rows] == [Path(e["image"]).name for e in engine.data["test"]]
    assert sum(r["correct"] for r in rows) / len(rows) == pytest.approx(metrics["accuracy"])
    assert set(engine.validation_metrics(model)) == {"val_accuracy"}


def test_same_seed_same_network_and_result(cls_datalist):
    results = []
    for _ in range(2):
        engine = _engine(cls_datalist)
        model = engine.build_network()
        results.append((engine.train(model, ClientObjective(), RoundContext("site-a", 0, 1))["train_loss"], model.state_dict()))
    assert results[0][0] == results[1][0]
    for k, v in results[0][1].items():
        assert torch.equal(v, results[1][1][k])


class _Recorder(ClientObjective):
    """Asks for features and records what the engine hands over."""

    name = "recorder"
    needs_features = True

    def __init__(self):
        super().__init__()
        self.seen = []

    def loss(self, out):
        self.seen.append((tuple(out.logits.shape), tuple(out.labels.shape), {k: tuple(v.shape) for k, v in out.features.items()}))
        return super().loss(out)


def test_features_are_the_vit_tokens(cls_datalist):
    engine = _engine(cls_datalist)
    model = engine.build_network()
    objective = _Recorder()
    engine.train(model, objective, RoundContext("site-a", 0, 1))
    logits, labels, features = objective.seen[0]
    assert logits == (4, 2) and labels == (4,)
    assert features == {"tokens": (4, 4, 96)}  # (32 / 16)^2 tokens of width 96


def test_fedefm_objective_trains_on_the_engine(cls_datalist):
    """FedEFM's distillation with one teacher runs end to end on the engine's batches and reports
    one teacher weight (the declared statistic)."""
    from fedseg.objectives.fedefm import FedEFMObjective

    engine = _engine(cls_datalist)
    model = engine.build_network()
    teacher = {k: v.clone() for k, v in engine.build_network().state_dict().items()}
    objective = FedEFMObjective()
    ctx = RoundContext("site-a", 1, 2, server_meta={"fedefm_teachers": ["site-b"]}, models={"expert@site-b": teacher})
    objective.begin_round(ctx, model)
    assert objective.needs_features
    out = engine.train(model, objective, ctx)
    stats = objective.end_round(ctx, model, engine)
    assert out["steps"] == 3 and len(stats["teacher_weights"]) == 1 and len(stats["teacher_emd"]) == 1


def test_round_learning_rate(cls_datalist):
    engine = _engine(cls_datalist, learning_rate=0.01, lr_decay_per_round=0.5)
    model = engine.build_network()
    optimizer = engine.prepare_optimizer(model, RoundContext("site-a", 3, 5))
    assert optimizer is engine.make_optimizer(model)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**3)


# ------------------------------------------------------------------------------- factory and client
def test_factory_picks_the_engine_by_task(cls_datalist, tiny_datalist, tiny_train_config):
    from fedseg.engine import SegEngine
    from fedseg.engine.classification import ClassificationEngine
    from fedseg.engine.factory import build_engine

    assert isinstance(build_engine("site-a", cls_datalist, CONFIG), ClassificationEngine)
    assert isinstance(build_engine("site-a", cls_datalist, {**CONFIG, "task": "classification"}), ClassificationEngine)
    assert isinstance(build_engine("site-a", tiny_datalist, tiny_train_config), SegEngine)
    with pytest.raises(ValueError, match="job's task is 'segmentation' but the datalist .* 'classification'"):
        build_engine("site-a", cls_datalist, {**CONFIG, "task": "segmentation"})
    with pytest.raises(ValueError, match="job's task is 'classification'"):
        build_engine("site-a", tiny_datalist, {**tiny_train_config, "task": "classification"})


def test_site_runner_trains_and_evaluates_a_classifier(cls_datalist, tmp_path):
    """The site client's task handling on a classification site: val_accuracy with the weights, test
    accuracy metrics on evaluate, per-image rows kept in the site's workspace only."""
    import argparse

    from fedseg.config import resolve_profile
    from fedseg.engine.factory import build_engine
    from fedseg.fl.client import SiteRunner
    from fedseg.fl.protocol import META_KEY

    cfg = {**resolve_profile("tiny")["train_config"], **CONFIG, "task": "classification"}
    initial = {k: v.clone() for k, v in build_engine("site-a", cls_datalist, cfg).build_network().state_dict().items()}
    args = argparse.Namespace(datalist=str(cls_datalist), site_datalists=None, data_root=None, bundle_dir=None)
    runner = SiteRunner("site-a", args, workspace=str(tmp_path))
    meta = {META_KEY: {"objective": "fedavg", "objective_args": {}, "train_config": cfg, "round": 0, "total_rounds": 1}}
    out = runner.handle("train", initial, meta)
    assert {"train_loss", "steps", "val_accuracy"} <= set(out["metrics"]) and "val_dice" not in out["metrics"]
    assert out["meta"] == {"n_samples": 12, "round": 0} and set(out["params"]) == set(initial)
    out = runner.handle("evaluate", out["params"], {**meta, "model_name": "global"})
    assert {"accuracy", "balanced_accuracy"} <= set(out["metrics"]) and out["params"] == {}
    record = json.loads(runner.per_image_path("global").read_text())
    assert len(record["rows"]) == 6 and {"id", "label", "prediction", "correct"} == set(record["rows"][0])
    assert not list((tmp_path / "fedseg_outputs" / "site-a").glob("overlays_*"))


def test_report_of_a_classification_run(tmp_path):
    """summary.md and the plots follow val_accuracy and the accuracy columns when the sites sent them."""
    from fedseg.fl.report import RunReport, summarise, validation_metric

    report = RunReport("fedavg", ["a", "b"], {"train_config": {"task": "classification"}})
    report.add_round(0, {"a": {"train_loss": 0.7, "val_accuracy": 0.5}, "b": {"train_loss": 0.6, "val_accuracy": 0.75}})
    report.final = {"global": {"a": {"accuracy": 0.5, "balanced_accuracy": 0.5}, "b": {"accuracy": 1.0, "balanced_accuracy": 1.0}}}
    assert "mean val_accuracy 0.6250" in report.round_summary(0)
    path = report.write(tmp_path)
    data = json.loads(path.read_text())
    assert validation_metric(data) == "val_accuracy" and "label_space" in data["final"]["note"]
    text = summarise(data)
    assert "## Validation accuracy per round" in text and "| 0 | 0.5000 | 0.7500 |" in text
    assert "| site | Accuracy | Balanced accuracy |" in text and "| **mean** | 0.7500 | 0.7500 |" in text
    assert (tmp_path / "plots" / "val_accuracy.png").is_file()
    assert validation_metric({"rounds": [{"metrics": {"a": {"val_dice": 0.3}}}]}) == "val_dice"


def test_bundle_for_task():
    from fedseg.bundle import bundle_for_task

    assert bundle_for_task({"task": "classification"}).name == "vit_foundation"
    assert bundle_for_task({"task": None}).name == "unet2d_seg"
    with pytest.raises(ValueError, match="unknown task 'detection'"):
        bundle_for_task({"task": "detection"})
