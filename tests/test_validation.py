"""The server rejects unusable or over-sharing site results with a reason, and keeps the rest."""

from __future__ import annotations

import pytest
import torch

from fedseg.fl.validation import InvalidUpdateError, validate_params, validate_statistics

REF = {"w": torch.zeros(3, 2), "b": torch.zeros(2), "count": torch.tensor(0, dtype=torch.long)}


def good():
    return {"w": torch.ones(3, 2), "b": torch.ones(2), "count": torch.tensor(4)}


def test_valid_update_passes_and_is_cast():
    out = validate_params("s1", {k: v.numpy() for k, v in good().items()}, REF)
    assert set(out) == set(REF) and out["w"].dtype == torch.float32 and out["count"].dtype == torch.long


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda p: p.update(w=torch.full((3, 2), float("nan"))), "NaN or Inf"),
        (lambda p: p.update(b=torch.tensor([1.0, float("inf")])), "NaN or Inf"),
        (lambda p: p.update(w=torch.ones(2, 3)), "shape"),
        (lambda p: p.pop("b"), "missing"),
        (lambda p: p.update(extra=torch.ones(1)), "unexpected"),
        (lambda p: p.clear(), "empty"),
    ],
)
def test_bad_updates_rejected_with_reason(mutate, message):
    params = good()
    mutate(params)
    with pytest.raises(InvalidUpdateError, match=message) as err:
        validate_params("site-7", params, REF)
    assert "site-7" in str(err.value)


def test_statistics_keep_only_declared_finite_scalars():
    meta = {"uncertainty": 0.3, "n_samples": 12, "image_paths": ["a.png"], "vector": [0.1, 0.2]}
    out = validate_statistics("s", meta, ("uncertainty", "vector"))
    assert out == {"uncertainty": 0.3, "vector": [0.1, 0.2]}


@pytest.mark.parametrize(
    "value, message",
    [(float("nan"), "not finite"), ("a string", "not numeric"), (list(range(100)), "entries"), ({"a": 1}, "not numeric")],
)
def test_statistics_rejected(value, message):
    with pytest.raises(InvalidUpdateError, match=message):
        validate_statistics("s", {"u": value}, ("u",))
