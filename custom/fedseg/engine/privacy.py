"""Opacus DP-SGD for ``SegEngine``: one :class:`PrivateTraining` per (engine, model), kept for the whole job.

What is privatised (see also ``SegEngine.train``): every optimiser step uses the Poisson-subsampled
Gaussian mechanism of DP-SGD on the objective's *data term* (``ClientObjective.data_loss``) — per-sample
gradients computed by Opacus' hooks, each clipped to ``dp_max_grad_norm``, summed, Gaussian noise of
std ``noise_multiplier * dp_max_grad_norm`` added, divided by the expected batch size. The objective's
*parameter-only term* (``ClientObjective.parameter_loss``: a function of the current weights and of
server-sent information only, e.g. GraphFedSeg's similarity regulariser) touches no training record;
its exact gradient is added to the privatised one afterwards, which is post-processing and spends no
budget. The accountant (PRV, Opacus' default) composes all steps of all rounds; ``epsilon`` is the
epsilon spent so far at ``delta``.

Design choices:
  * ``wrap_model=False``: Opacus attaches its hooks to the model itself instead of wrapping it in a
    ``GradSampleModule``, so the object the client loads and sends stays the plain network, with its
    own ``state_dict`` keys (no ``_module.`` prefix) and the same parameter tensors the DP optimiser
    updates. The hooks live only inside ``training()``; outside it the model carries no Opacus state.
  * Poisson sampling (Opacus' ``DPDataLoader``): the accountant's assumption. The dataset is adapted
    to ``(image, label)`` tuples because ``DPDataLoader`` derives the shape of an empty batch from a
    tuple-valued ``dataset[0]``; an empty batch still makes a (noise-only) step, as the analysis needs.
  * Sampling and noise generators are seeded from OS entropy unless a seed is given (tests only: a
    seed the server knows — e.g. ``train_config["seed"]`` — would let it subtract the noise).
    Opacus' ``secure_mode`` (CSPRNG noise, needs ``torchcsprng``) is not used.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from monai.data import DataLoader
from opacus import PrivacyEngine
from opacus.accountants.utils import get_noise_multiplier
from opacus.grad_sample.utils import prepare_module
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator
from torch import nn
from torch.utils.data import Dataset

logger = logging.getLogger(__name__)

#: Opacus accountant used to calibrate the noise and report epsilon
ACCOUNTANT = "prv"
#: accountant history kept in ``RoundContext.state_dir`` so a restarted site keeps counting
STATE_FILE = "dp_accountant.json"
#: module attributes Opacus' hooks leave behind on the layers they capture
_LAYER_ATTRS = ("activations", "max_batch_len")


class ImageLabelDataset(Dataset):
    """``(image, label)`` tuples from a dataset of ``{"image", "label"}`` dicts."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        item = self.dataset[index]
        if isinstance(item, list):  # patch mode: one patch per image under DP (SegEngine forces patch_samples=1)
            (item,) = item
        return item["image"], item["label"]


@functools.lru_cache(maxsize=64)
def calibrated_noise_multiplier(target_epsilon: float, delta: float, sample_rate: float, epochs: int, accountant: str
                                ) -> float:
    """The smallest noise multiplier with which ``epochs`` epochs at ``sample_rate`` spend at most ``target_epsilon``
    at ``delta`` (Opacus' ``get_noise_multiplier``). A pure function of its arguments, memoised: its search evaluates
    the accountant some fifteen times (seconds), and each model a process makes private with the same plan (a site
    restarted in the same process, a method's second model, a test) needs the same number."""
    return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate,
                                      epochs=epochs, accountant=accountant))


def _generator(seed: Optional[int], device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(int(seed) if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
    return generator


class PrivateTraining:
    """Opacus state of one model: privacy engine (accountant), DP optimiser, Poisson data loader.

    Args:
        model: the plain network (its parameters must be those of ``optimizer``).
        optimizer: the engine's optimiser for ``model``; wrapped, so its state (Adam moments) is shared.
        dataset: the training dataset of ``{"image", "label"}`` dicts.
        batch_size: the expected Poisson batch size (sample rate ``1 / ceil(N / batch_size)``).
        target_epsilon, delta: the budget for the whole job.
        epochs: local epochs over the whole job (``total_rounds * local_epochs``); the noise multiplier
            is calibrated so that ``epsilon <= target_epsilon`` after exactly that many epochs.
        max_grad_norm: per-sample clipping bound C.
        seed: seeds the sampling and noise generators (tests only); ``None`` draws them from OS entropy.
        accountant: Opacus accountant name.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: Dataset,
        *,
        batch_size: int,
        target_epsilon: float,
        delta: float,
        epochs: int,
        max_grad_norm: float,
        seed: Optional[int] = None,
        accountant: str = ACCOUNTANT,
        device: Optional[torch.device] = None,
    ):
        if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
            raise ValueError(f"dp_target_epsilon must be a positive finite number, got {target_epsilon}")
        if not 0 < delta < 1:
            raise ValueError(f"dp_delta must be in (0, 1), got {delta}")
        if not max_grad_norm > 0:
            raise ValueError(f"dp_max_grad_norm must be positive, got {max_grad_norm}")
        if epochs < 1:
            raise ValueError(f"DP needs at least one planned epoch, got {epochs}")
        ModuleValidator.validate(model, strict=True)
        self.model = model
        self.target_epsilon = float(target_epsilon)
        self.delta = float(delta)
        self.epochs = int(epochs)
        self.max_grad_norm = float(max_grad_norm)
        device = device or next(model.parameters()).device
        sampling_seed = None if seed is None else int(seed)
        noise_seed = None if seed is None else int(seed) + 1
        loader = DataLoader(
            ImageLabelDataset(dataset),
            batch_size=int(batch_size),
            shuffle=True,
            num_workers=0,
            generator=_generator(sampling_seed, torch.device("cpu")),
        )
        self.privacy_engine = PrivacyEngine(accountant=accountant, secure_mode=False)
        # what make_private_with_epsilon does, with the calibration memoised
        noise_multiplier = calibrated_noise_multiplier(
            self.target_epsilon, self.delta, 1.0 / len(loader), self.epochs, self.privacy_engine.accountant.mechanism())
        hooks, dp_optimizer, dp_loader = self.privacy_engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            poisson_sampling=True,
            noise_generator=_generator(noise_seed, device),
            grad_sample_mode="hooks",
            wrap_model=False,
        )
        self._hooks = hooks
        self.optimizer: DPOptimizer = dp_optimizer
        self.data_loader = dp_loader
        self.sample_rate = float(dp_loader.sample_rate)
        self.planned_steps = int(self.epochs / self.sample_rate)
        self._detach()  # hooks live only inside training()
        logger.info(
            "DP-SGD: target (%.3g, %.1e), sample rate %.4f, %d planned steps, noise multiplier %.4f, C = %.3g",
            self.target_epsilon, self.delta, self.sample_rate, self.planned_steps, self.noise_multiplier, self.max_grad_norm,
        )

    # --------------------------------------------------------------------------------------- state
    @property
    def noise_multiplier(self) -> float:
        return float(self.optimizer.noise_multiplier)

    @property
    def accountant(self):
        return self.privacy_engine.accountant

    @property
    def steps_taken(self) -> int:
        """Noisy steps composed by the accountant so far (all rounds)."""
        return int(sum(entry[2] for entry in self.accountant.history))

    @property
    def epsilon(self) -> float:
        """Epsilon spent so far at ``delta`` (0 before the first step; infinite after a noiseless step)."""
        history = self.accountant.history
        if not history:
            return 0.0
        if any(entry[0] <= 0 for entry in history):
            return math.inf
        return float(self.accountant.get_epsilon(self.delta))

    def _plan(self) -> Dict[str, Any]:
        return {
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
            "epochs": self.epochs,
            "sample_rate": self.sample_rate,
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
        }

    def save(self, state_dir: Optional[str], round_index: int) -> None:
        """Write the accountant history after ``round_index`` (atomic)."""
        if not state_dir:
            return
        os.makedirs(state_dir, exist_ok=True)
        path = os.path.join(state_dir, STATE_FILE)
        record = {"round": int(round_index), "plan": self._plan(), "history": [list(h) for h in self.accountant.history]}
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)

    def restore(self, state_dir: Optional[str], round_index: int) -> bool:
        """After a process restart: resume the accountant of this job from ``state_dir``.

        Used only when the accountant is still empty and ``round_index > 0`` (round 0 is a new job), and
        only if the record was written under the same plan (same noise multiplier, sample rate, ...).
        Re-counting a round that had already been trained before the restart errs on the safe side.
        """
        if not state_dir or round_index <= 0 or self.accountant.history:
            return False
        path = os.path.join(state_dir, STATE_FILE)
        if not os.path.exists(path):
            return False
        with open(path) as f:
            record = json.load(f)
        if record.get("plan") != self._plan():
            logger.warning("DP accountant record in %s has another plan; starting the count afresh", path)
            return False
        self.accountant.history = [tuple(entry) for entry in record["history"]]
        logger.info("DP accountant resumed from %s: %d steps, epsilon %.3f", path, self.steps_taken, self.epsilon)
        return True

    # ------------------------------------------------------------------------------------ training
    def _attach(self) -> None:
        if self._hooks is None:
            self._hooks = prepare_module(self.model, "hooks", wrap_model=False, batch_first=True, loss_reduction="mean")
            self._hooks.forbid_grad_accumulation()
            for p in self.optimizer.params:
                p.summed_grad = None

    def _detach(self) -> None:
        """Remove the hooks and every per-sample tensor/attribute Opacus put on the model."""
        if self._hooks is None:
            return
        self.optimizer.zero_grad(set_to_none=True)
        self._hooks.cleanup()  # removes the hooks and grad_sample & co. from the parameters
        for p in self.optimizer.params:
            if hasattr(p, "summed_grad"):
                del p.summed_grad
        self._hooks = None
        for module in self.model.modules():
            for attr in _LAYER_ATTRS:
                if attr in module.__dict__:
                    delattr(module, attr)

    @contextlib.contextmanager
    def training(self) -> Iterator["PrivateTraining"]:
        """Per-sample-gradient hooks attached for the duration of the block."""
        self._attach()
        try:
            with warnings.catch_warnings():
                # the first layer's input does not require grad: expected, Opacus only needs its output grad
                warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
                yield self
        finally:
            self._detach()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def empty_batch(self) -> None:
        """A Poisson batch with no sample: zero per-sample gradients, so the step adds noise only."""
        for p in self.optimizer.params:
            p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)

    def step(self, parameter_loss: Optional[torch.Tensor] = None) -> None:
        """One DP-SGD step: clip + noise the per-sample gradients of the data term (``pre_step``, which
        also records the step in the accountant), add the exact gradient of ``parameter_loss``, then
        the wrapped optimiser's update."""
        if not self.optimizer.pre_step():
            raise RuntimeError("DP optimiser skipped a step: gradient accumulation is not used by SegEngine")
        if parameter_loss is not None:
            params: List[torch.Tensor] = [p for p in self.optimizer.params if p.requires_grad]
            grads = torch.autograd.grad(parameter_loss, params, allow_unused=True)
            for p, g in zip(params, grads):
                if g is not None:
                    p.grad.add_(g)
        self.optimizer.original_optimizer.step()
