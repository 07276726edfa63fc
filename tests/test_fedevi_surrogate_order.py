"""FedEvi's site statistics as its authors' code computes them, pinned on built-in data through the real server workflow.

The authors' ``scoring_func`` (their ``utils/utils.py``), called in their main loop after every site's local training
and the surrogate ``sum_k beta_k^{r-1} theta_k^r``, before the round's new global model: for each validation image
(batch 1, the test transform: no augmentation, each image / its maximum, the stored size = the network's grid), with
both models in eval mode and no gradients, the pixel-mean epistemic uncertainty of the surrogate (G) and the pixel-mean
aleatoric uncertainty of the site's own model right after this round's training (A), each then averaged over the
images. Here every round's G and A of an in-process FedEvi run (``paper`` profile) are recomputed from the models the
sites actually sent and the weights the server reported, with SciPy's digamma on the validation images; the network
has batch norm, whose train and eval modes differ, so a pass in the wrong mode or on augmented images would not match.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import digamma

from fedseg.bench.inprocess import InProcessController, controller_args
from fedseg.engine.engine import SegEngine
from fedseg.fl.protocol import TRAIN_TASK

from inprocess import builtin_sites


class RecordingController(InProcessController):
    """Keeps every round's train results (the local models theta_k^r the sites sent)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.local_models = {}

    def _exchange(self, task_name, payloads, round_, *args, **kwargs):
        results = super()._exchange(task_name, payloads, round_, *args, **kwargs)
        if task_name == TRAIN_TASK:
            self.local_models[round_] = {s: {k: v.clone() for k, v in u.params.items()} for s, u in results.items()}
        return results


def _their_uncertainties(engine: SegEngine, params) -> tuple:
    """Per validation image: (pixel-mean epistemic, pixel-mean aleatoric) of ``params``, eval mode, network grid."""
    model = engine.build_network()
    model.load_state_dict(params)
    model.eval()
    epistemic, aleatoric = [], []
    with torch.no_grad():
        for batch in engine.loader("validation"):  # one image at a time, the evaluation pipeline
            z = np.minimum(model(batch["image"]).double().numpy(), 80.0)
            alpha = np.exp(z) + 1.0
            strength = alpha.sum(axis=1, keepdims=True)
            rho = alpha / strength
            entropy = -(rho * np.log(rho)).sum(axis=1)
            expected_entropy = (rho * (digamma(strength + 1.0) - digamma(alpha + 1.0))).sum(axis=1)
            epistemic.append(float((entropy - expected_entropy).mean()))
            aleatoric.append(float(expected_entropy.mean()))
    return np.array(epistemic), np.array(aleatoric)


@pytest.fixture(scope="module")
def fedevi_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fedevi_order")
    sites = builtin_sites("polyp", ["site-1", "site-2"], tmp / "data")
    args = controller_args("fedevi", tmp, profile="paper", num_rounds=3, local_epochs=1, image_size=32,
                           channels=[8, 16, 32, 64], data_profile="tiny", batch_size=2, norm="batch",
                           eval_best_val_round=False)
    controller = RecordingController(sites, tmp / "server", tmp / "sites", **args)
    controller.run()
    import json

    report = json.loads((tmp / "server" / "report.json").read_text())
    return report, controller, sites


def test_g_and_a_are_the_authors_scores_of_the_surrogate_and_the_fresh_local_model(fedevi_run):
    report, controller, sites = fedevi_run
    engines = {s: SegEngine(s, p, controller.train_config) for s, p in sites.items()}
    assert controller.train_config["augment_level"] == "flip" and controller.train_config["intensity"] == "image_max"
    for r, round_report in enumerate(report["rounds"]):
        local = controller.local_models[r]
        beta_prev = round_report["beta_prev"]
        surrogate = {k: sum(beta_prev[s] * local[s][k].double() for s in sites).float() if local["site-1"][k].is_floating_point()
                     else local["site-1"][k] for k in local["site-1"]}
        for site, engine in engines.items():
            gap, _ = _their_uncertainties(engine, surrogate)
            _, aleatoric = _their_uncertainties(engine, local[site])
            assert round_report["G"][site] == pytest.approx(gap.mean(), rel=1e-4, abs=1e-7), (r, site)
            assert round_report["A"][site] == pytest.approx(aleatoric.mean(), rel=1e-4), (r, site)
        # the round's global model is last round's weights updated by this round's G / A, over this round's models
        beta = round_report["beta"]
        for k, v in controller.saved[r].items():
            if torch.as_tensor(v).is_floating_point():
                want = sum(beta[s] * local[s][k].double() for s in sites)
                torch.testing.assert_close(torch.as_tensor(v).double(), want, atol=1e-5, rtol=1e-5)
                break
        if r:
            assert beta_prev == pytest.approx(report["rounds"][r - 1]["beta"])


def test_a_pass_in_train_mode_or_on_augmented_images_would_differ(fedevi_run):
    """The check above can fail: batch norm in train mode gives another A on the same images."""
    report, controller, sites = fedevi_run
    engine = SegEngine("site-1", sites["site-1"], controller.train_config)
    model = engine.build_network()
    model.load_state_dict(controller.local_models[0]["site-1"])
    model.train()
    values = []
    with torch.no_grad():
        for batch in engine.loader("validation"):
            alpha = np.exp(np.minimum(model(batch["image"]).double().numpy(), 80.0)) + 1.0
            strength = alpha.sum(axis=1, keepdims=True)
            rho = alpha / strength
            values.append(float((rho * (digamma(strength + 1.0) - digamma(alpha + 1.0))).sum(axis=1).mean()))
    assert abs(np.mean(values) - report["rounds"][0]["A"]["site-1"]) > 1e-3
