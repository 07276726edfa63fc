"""PathFL's building blocks against hand computations, pooled statistics and brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedseg.alignment import (
    adain_restyle,
    channel_statistics,
    global_feature_moments,
    half_plane_mask,
    hybrid_images,
    similarity_matrix,
    ssa_mixing_matrix,
    stratified_average,
    stratum_names,
    stratum_of,
    stratum_outputs,
)
from fedseg.alignment.style import ORIENTATIONS
from fedseg.fl.validation import InvalidUpdateError, validate_arrays
from fedseg.networks import UNET_VARIANTS, FeatureAlignment, FeatureUNet
from fedseg.objectives.pathfl import PathFLObjective
from fedseg.objectives.base import RoundContext
from fedseg.strategies.base import ClientUpdate
from fedseg.strategies.pathfl import PathFLStrategy

TINY = dict(in_channels=3, out_channels=2, channels=(8, 16, 32, 64))


# ------------------------------------------------------------------------------------------ CSE
def test_adain_matches_hand_computation():
    rng = np.random.default_rng(0)
    x = rng.random((2, 3, 5, 4))
    style_mean, style_std = np.array([0.2, 0.5, 0.7]), np.array([0.1, 0.3, 0.05])
    expected = np.empty_like(x)
    for b in range(2):
        for c in range(3):
            ch = x[b, c]
            sd = np.sqrt(((ch - ch.mean()) ** 2).mean())
            expected[b, c] = (ch - ch.mean()) / sd * style_std[c] + style_mean[c]
    out = adain_restyle(torch.tensor(x), torch.tensor(style_mean), torch.tensor(style_std)).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-8)
    mean, std = channel_statistics(torch.tensor(out))
    np.testing.assert_allclose(mean.numpy(), np.tile(style_mean, (2, 1)), atol=1e-7)
    np.testing.assert_allclose(std.numpy(), np.tile(style_std, (2, 1)), atol=1e-6)


def test_adain_with_whole_image_statistics_matches_hand_computation():
    """A patch restyled with the statistics of the image it was cut from (``cse_statistics="image"``)."""
    rng = np.random.default_rng(1)
    image = rng.random((3, 40, 40))
    patch = image[:, 8:24, 16:32][None]  # (1, 3, 16, 16)
    mu, sd = image.reshape(3, -1).mean(1), image.reshape(3, -1).std(1)  # numpy std: population
    style_mean, style_std = np.array([0.2, 0.5, 0.7]), np.array([0.1, 0.3, 0.05])
    expected = (patch - mu[None, :, None, None]) / sd[None, :, None, None] * style_std[None, :, None, None] + style_mean[None, :, None, None]
    out = adain_restyle(torch.tensor(patch), torch.tensor(style_mean), torch.tensor(style_std),
                        source=(torch.tensor(mu[None]), torch.tensor(sd[None])))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match="source statistics"):
        adain_restyle(torch.tensor(patch), torch.tensor(style_mean), torch.tensor(style_std), source=(torch.zeros(2, 3), torch.ones(2, 3)))


def test_channel_statistics_transform_travels_into_every_patch():
    from monai.transforms import Compose, RandCropByPosNegLabeld

    from fedseg.data.transforms import ChannelStatisticsd

    rng = np.random.default_rng(2)
    image = rng.random((3, 48, 48)).astype(np.float32)
    label = (rng.random((1, 48, 48)) > 0.7).astype(np.float32)
    crop = RandCropByPosNegLabeld(keys=["image", "label"], label_key="label", spatial_size=(16, 16), num_samples=3)
    patches = Compose([ChannelStatisticsd(keys="image"), crop])({"image": torch.tensor(image), "label": torch.tensor(label)})
    for patch in patches:
        np.testing.assert_allclose(patch["image_mean"].numpy(), image.reshape(3, -1).mean(1), rtol=1e-5)
        np.testing.assert_allclose(patch["image_std"].numpy(), image.reshape(3, -1).std(1), rtol=1e-5)


def test_objective_uses_whole_image_statistics_when_asked():
    model = FeatureUNet(**TINY, feature_alignment=False)
    x = torch.rand(2, 3, 16, 16)
    source = (torch.full((2, 3), 0.4), torch.full((2, 3), 0.2))
    for kind, expected_mean in (("image", source[0].mean(0)), ("patch", channel_statistics(x)[0].mean(0))):
        obj = PathFLObjective(use_afa=False, use_ssa=False, cse_statistics=kind)
        obj.begin_round(RoundContext("s", 0, 2), model)
        obj.prepare_inputs(x, torch.zeros(2, 1, 16, 16), source)
        stats = obj.end_round(RoundContext("s", 0, 2), model, engine=None)
        assert stats["cse_mean"] == pytest.approx(expected_mean.tolist(), rel=1e-6)
    pool = {"mean": [[0.5, 0.5, 0.5]], "std": [[0.1, 0.1, 0.1]]}
    obj = PathFLObjective(use_afa=False, use_ssa=False, cse_statistics="image")
    obj.begin_round(RoundContext("s", 1, 2, server_meta={"cse_style_pool": pool}), model)
    obj.prepare_inputs(x, torch.zeros(2, 1, 16, 16), source)
    _, restyled, _ = obj.last_examples()
    torch.testing.assert_close(restyled[0], (x[0] - 0.4) / 0.2 * 0.1 + 0.5)
    with pytest.raises(ValueError, match="cse_statistics"):
        PathFLObjective(cse_statistics="slide")


@pytest.mark.parametrize("turns,flip", ORIENTATIONS)
def test_half_plane_mask_is_exactly_half_in_every_orientation(turns, flip):
    mask = half_plane_mask(6, 6, turns, flip)
    assert mask.shape == (6, 6) and set(mask.unique().tolist()) == {0.0, 1.0}
    assert int(mask.sum()) == 18
    # a half-plane: split by one straight line through the centre (rows or columns constant)
    assert bool((mask == mask[:, :1]).all()) or bool((mask == mask[:1, :]).all())


def test_half_plane_masks_cover_the_four_halves_and_reject_odd_sides():
    masks = {tuple(half_plane_mask(4, 4, k, f).flatten().tolist()) for k, f in ORIENTATIONS}
    assert len(masks) == 4  # top, bottom, left, right
    with pytest.raises(ValueError, match="even"):
        half_plane_mask(5, 4)
    with pytest.raises(ValueError, match="square"):
        half_plane_mask(4, 6, 1)


def test_hybrid_keeps_half_of_the_original_and_half_restyled():
    torch.manual_seed(0)
    x = torch.rand(8, 3, 8, 8)
    pool_mean, pool_std = [[0.9, 0.1, 0.5]], [[0.02, 0.02, 0.02]]
    hybrid, restyled = hybrid_images(x, pool_mean, pool_std, generator=torch.Generator().manual_seed(1))
    np.testing.assert_allclose(restyled.numpy(), adain_restyle(x, torch.tensor(pool_mean[0]), torch.tensor(pool_std[0])).numpy(), atol=1e-6)
    for b in range(8):
        from_original = (hybrid[b] == x[b]).all(0)
        from_style = (hybrid[b] == restyled[b]).all(0)
        assert int(from_original.sum()) == 32 and int(from_style.sum()) == 32
        assert bool((from_original ^ from_style).all())


# ------------------------------------------------------------------------------------------ AFA
def test_global_moments_equal_pooled_statistics():
    rng = np.random.default_rng(3)
    sites = [rng.normal(loc, scale, size=500) for loc, scale in ((0.2, 1.0), (1.5, 0.3), (-0.4, 2.0))]
    mu, sigma = global_feature_moments([z.mean() for z in sites], [(z * z).mean() for z in sites])
    pooled_mean = np.concatenate(sites).mean()  # equal element counts: mean of means = pooled mean
    assert mu == pytest.approx(pooled_mean, rel=1e-12)
    direct = np.mean([np.sqrt(((z - pooled_mean) ** 2).mean()) for z in sites])  # eq. 11 on the elements
    assert sigma == pytest.approx(direct, rel=1e-9)
    with pytest.raises(ValueError, match="invalid moments"):
        global_feature_moments([1.0], [0.5])


def test_feature_alignment_layer():
    layer = FeatureAlignment()
    z = torch.randn(3, 4, 5, 5) * 3 + 2
    assert torch.equal(layer(z), z)  # inactive: identity
    layer.set_target(0.5, 0.25, at_inference=False)
    out = layer.train()(z)
    per_sample = out.flatten(1)
    np.testing.assert_allclose(per_sample.mean(1).numpy(), 0.5, atol=1e-5)
    np.testing.assert_allclose(per_sample.std(1, unbiased=False).numpy(), 0.25, atol=1e-4)
    # per-sample statistics: a sample's output does not depend on the rest of its batch
    torch.testing.assert_close(layer(z[:1]), out[:1])
    assert torch.equal(layer.eval()(z), z)  # eval mode without at_inference: identity
    layer.set_target(0.5, 0.25, at_inference=True)
    torch.testing.assert_close(layer.eval()(z), out)


@pytest.mark.parametrize("variant", UNET_VARIANTS)
def test_unet_with_alignment_keeps_initial_weights_and_scripts(variant):
    plain = FeatureUNet(**TINY, init_seed=0, variant=variant)
    aligned = FeatureUNet(**TINY, init_seed=0, feature_alignment=True, variant=variant)
    extra = set(aligned.state_dict()) - set(plain.state_dict())
    assert extra == {f"bottleneck_alignment.{b}" for b in ("target_mean", "target_std", "active", "at_inference")}
    for k, v in plain.state_dict().items():
        assert torch.equal(v, aligned.state_dict()[k])
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(plain(x), aligned(x))  # inactive layer
    aligned.bottleneck_alignment.set_target(1.0, 2.0, at_inference=True)
    scripted = torch.jit.script(aligned.eval())
    torch.testing.assert_close(scripted(x), aligned(x))
    assert not torch.allclose(aligned(x), plain.eval()(x))


# ------------------------------------------------------------------------------------------ SSA
@pytest.mark.parametrize("channels", [(8, 16), (8, 16, 32, 64), (4, 8, 16, 32, 64)])
def test_strata_cover_every_parameter_exactly_once(channels):
    net = FeatureUNet(in_channels=3, out_channels=2, channels=channels, feature_alignment=True)
    depth = len(channels) - 1
    names = stratum_names(depth)
    assert len(names) == 2 * depth + 2 and len(set(names)) == len(names)
    by_stratum = {n: [] for n in names}
    for key in net.state_dict():
        s = stratum_of(key, depth)
        if s is None:
            assert key.startswith("bottleneck_alignment.")
            continue
        by_stratum[s].append(key)
    assert all(by_stratum.values()), {k: len(v) for k, v in by_stratum.items()}
    assert sorted(sum(by_stratum.values(), [])) == sorted(k for k in net.state_dict() if not k.startswith("bottleneck_alignment."))
    assert list(stratum_outputs(net, torch.rand(1, 3, 2**depth * 2, 2**depth * 2))) == names
    with pytest.raises(ValueError):
        stratum_of("something.else", depth)


def test_similarity_matches_numpy_cosine_clipped():
    rng = np.random.default_rng(0)
    outs = [rng.normal(size=(2, 3, 4)) for _ in range(4)]
    sim = similarity_matrix([torch.tensor(o) for o in outs]).numpy()
    flat = [o.ravel() for o in outs]
    for i, j in itertools.product(range(4), range(4)):
        cos = flat[i] @ flat[j] / np.linalg.norm(flat[i]) / np.linalg.norm(flat[j])
        assert sim[i, j] == pytest.approx(max(cos, 0.0), abs=1e-12)


def _brute_force_ssa(models, sim):
    """w = 1/(2M) sum_m [w_m + sum_{j != m} s_mj w_j] with s row-normalised over j != m (the spec)."""
    m = len(models)
    out = 0
    for a in range(m):
        others = [j for j in range(m) if j != a]
        total = sum(sim[a][j] for j in others)
        term = models[a] + sum((sim[a][j] / total) * models[j] for j in others)
        out = out + term
    return out / (2 * m)


similarity_matrices = st.integers(2, 6).flatmap(
    lambda m: st.lists(st.lists(st.floats(0.01, 1.0), min_size=m, max_size=m), min_size=m, max_size=m)
)


@settings(max_examples=60, deadline=None)
@given(similarity_matrices)
def test_ssa_weights_are_convex_and_match_the_formula(rows):
    sim = torch.tensor(rows, dtype=torch.float64)
    sim = (sim + sim.T) / 2
    sim.fill_diagonal_(1.0)
    p = ssa_mixing_matrix(sim)
    np.testing.assert_allclose(p.sum(1).numpy(), 1.0, atol=1e-12)
    weights = p.mean(0)
    assert bool((weights >= 0).all()) and float(weights.sum()) == pytest.approx(1.0, abs=1e-12)
    models = [torch.randn(5, dtype=torch.float64) for _ in range(len(rows))]
    avg = stratified_average([{"head.weight": x} for x in models], {"head": weights.tolist()}, lambda n: "head")
    torch.testing.assert_close(avg["head.weight"], _brute_force_ssa(models, sim.tolist()))


@settings(max_examples=40, deadline=None)
@given(similarity_matrices, st.randoms(use_true_random=False))
def test_ssa_weights_are_permutation_invariant(rows, rnd):
    sim = torch.tensor(rows, dtype=torch.float64)
    sim = (sim + sim.T) / 2
    sim.fill_diagonal_(1.0)
    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    perm_t = torch.tensor(perm)
    w = ssa_mixing_matrix(sim).mean(0)
    w_perm = ssa_mixing_matrix(sim[perm_t][:, perm_t]).mean(0)
    torch.testing.assert_close(w_perm, w[perm_t])


def test_ssa_identical_rows_and_two_sites_give_plain_average():
    for m in (2, 3, 5):
        uniform = torch.full((m,), 1.0 / m, dtype=torch.float64)
        sim = torch.full((m, m), 0.7, dtype=torch.float64).fill_diagonal_(1.0)
        torch.testing.assert_close(ssa_mixing_matrix(sim).mean(0), uniform)
    # two sites: whatever their similarity
    torch.testing.assert_close(ssa_mixing_matrix(torch.tensor([[1.0, 0.05], [0.05, 1.0]])).mean(0), torch.tensor([0.5, 0.5], dtype=torch.float64))
    # all similarities clipped to 0: uniform over the others
    torch.testing.assert_close(ssa_mixing_matrix(torch.eye(3, dtype=torch.float64)).mean(0), torch.full((3,), 1 / 3, dtype=torch.float64))


def _strategy(**kw):
    strategy = PathFLStrategy(**kw)
    strategy.network_factory = lambda: FeatureUNet(**TINY, feature_alignment=True)
    return strategy


def test_strategy_identical_sites_reduce_to_plain_average():
    base = FeatureUNet(**TINY, init_seed=0, feature_alignment=True).state_dict()
    strategy = _strategy()
    sites = ["a", "b", "c"]
    strategy.start(sites, base)
    noise = np.random.default_rng(0).normal(0.5, 0.2, size=(2, 3, 16, 16)).astype(np.float32)
    params = {k: v + 0.1 for k, v in base.items()}
    meta = {"ssa_noise": noise, "cse_mean": [0.1, 0.2, 0.3], "cse_std": [0.1, 0.1, 0.1], "afa_mean": 0.4, "afa_sq_mean": 0.5}
    updates = {s: ClientUpdate(s, params, n_samples=n, meta=meta) for s, n in zip(sites, (1, 5, 10))}
    fields = strategy.aggregate(0, updates, exchange=None)
    for stratum, w in fields["ssa_weights"].items():
        assert w == pytest.approx([1 / 3] * 3), stratum
    for k, v in strategy.global_params().items():
        if not k.startswith("bottleneck_alignment."):
            torch.testing.assert_close(v, params[k])
    assert fields["style_pool_size"] == 3
    assert strategy.payload("a", 1).meta["cse_style_pool"]["mean"] == [[0.1, 0.2, 0.3]] * 3
    g = strategy.global_params()
    assert float(g["bottleneck_alignment.active"]) == 1.0
    assert float(g["bottleneck_alignment.target_mean"]) == pytest.approx(0.4)
    assert float(g["bottleneck_alignment.target_std"]) == pytest.approx(np.sqrt(0.5 - 0.16))
    assert fields["ssa_coefficients"]["head"][0] == pytest.approx([0.5, 0.25, 0.25])


def test_strategy_without_ssa_is_fedavg():
    base = FeatureUNet(**TINY, init_seed=0).state_dict()
    strategy = PathFLStrategy(use_ssa=False, use_afa=False)
    strategy.start(["a", "b"], base)
    updates = {"a": ClientUpdate("a", {k: v * 0 for k, v in base.items()}, 1), "b": ClientUpdate("b", {k: v * 0 + 4 for k, v in base.items()}, 3)}
    fields = strategy.aggregate(0, updates, exchange=None)
    assert fields["aggregation_weight"] == pytest.approx({"a": 0.25, "b": 0.75})
    assert all(torch.allclose(v, torch.full_like(v, 3.0)) for v in strategy.global_params().values() if v.is_floating_point())
    with pytest.raises(ValueError, match="feature_alignment"):
        PathFLStrategy(use_ssa=False).start(["a"], base)


# ------------------------------------------------------------------------------------ client side
class _FakeEngine:
    def __init__(self, mean, std):
        self.stats = (torch.tensor(mean), torch.tensor(std))

    def intensity_statistics(self, split):
        return self.stats


def test_noise_batch_depends_only_on_declared_statistics():
    """The SSA noise is a function of the training set's per-channel mean/std (and the seed): two sites
    with different images but the same statistics send the same batch — no pixel can leave."""
    obj = PathFLObjective(ssa_noise_batch=64, ssa_noise_size=32)
    obj.begin_round(RoundContext("site-1", 0, 2, train_config={"seed": 0}), FeatureUNet(**TINY, feature_alignment=True))
    noise = obj.noise_batch(_FakeEngine([0.2, 0.5, 0.8], [0.05, 0.1, 0.2]), 0)
    assert noise.shape == (64, 3, 32, 32) and noise.dtype == np.float32
    np.testing.assert_allclose(noise.mean(axis=(0, 2, 3)), [0.2, 0.5, 0.8], atol=0.01)
    np.testing.assert_allclose(noise.std(axis=(0, 2, 3)), [0.05, 0.1, 0.2], rtol=0.02)
    twin = PathFLObjective(ssa_noise_batch=64, ssa_noise_size=32)
    twin.begin_round(RoundContext("site-1", 0, 2, train_config={"seed": 0}), FeatureUNet(**TINY, feature_alignment=True))
    np.testing.assert_array_equal(twin.noise_batch(_FakeEngine([0.2, 0.5, 0.8], [0.05, 0.1, 0.2]), 0), noise)
    assert obj.declared_arrays({"in_channels": 3}) == {"ssa_noise": (64, 3, 32, 32)}


def test_objective_statistics_and_style_mixing():
    model = FeatureUNet(**TINY, feature_alignment=True)
    obj = PathFLObjective(use_ssa=False)
    obj.begin_round(RoundContext("s", 0, 2), model)
    x = torch.rand(4, 3, 16, 16)
    assert obj.prepare_inputs(x, torch.zeros(4, 1, 16, 16)) is x  # no pool yet: unchanged
    model.train()(x)
    stats = obj.end_round(RoundContext("s", 0, 2), model, engine=None)
    mean, std = channel_statistics(x)
    assert stats["cse_mean"] == pytest.approx(mean.mean(0).tolist())
    assert stats["cse_std"] == pytest.approx(std.mean(0).tolist())
    with torch.no_grad():
        z = model.bottleneck(model.pool(model.encoders[2](model.pool(model.encoders[1](model.pool(model.encoders[0](x)))))))
    assert stats["afa_mean"] == pytest.approx(float(z.mean()), rel=1e-5)
    assert stats["afa_sq_mean"] == pytest.approx(float((z * z).mean()), rel=1e-5)
    pool = {"mean": [[0.5, 0.5, 0.5]], "std": [[0.1, 0.1, 0.1]]}
    obj.begin_round(RoundContext("s", 1, 2, server_meta={"cse_style_pool": pool}), model)
    hybrid = obj.prepare_inputs(x, torch.zeros(4, 1, 16, 16))
    assert int((hybrid == x).all(1).sum()) == 4 * 16 * 8
    originals, restyled, hybrids = obj.last_examples()
    assert originals.shape == restyled.shape == hybrids.shape == (1, 3, 16, 16)


def test_validate_arrays_checks_declared_shape_and_values():
    declared = {"ssa_noise": (2, 3, 4, 4)}
    ok = validate_arrays("s", {"ssa_noise": np.zeros((2, 3, 4, 4), np.float32), "other": 1}, declared)
    assert set(ok) == {"ssa_noise"}
    with pytest.raises(InvalidUpdateError, match="shape"):
        validate_arrays("s", {"ssa_noise": np.zeros((2, 3, 8, 8), np.float32)}, declared)
    bad = np.zeros((2, 3, 4, 4), np.float32)
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(InvalidUpdateError, match="finite"):
        validate_arrays("s", {"ssa_noise": bad}, declared)
    with pytest.raises(InvalidUpdateError, match="finite"):
        validate_arrays("s", {"ssa_noise": np.zeros((2, 3, 4, 4), np.uint8)}, declared)


def test_engine_intensity_statistics_match_numpy(tmp_path):
    from PIL import Image

    from fedseg.data.synthetic import generate_site_data
    from fedseg.engine import SegEngine

    datalist = generate_site_data("vessel", "site-1", tmp_path, profile="tiny")
    engine = SegEngine("site-1", datalist, {"channels": [8, 16, 32, 64], "patch_size": 16}, device=torch.device("cpu"))
    mean, std = engine.intensity_statistics("training")
    pixels = np.concatenate(
        [np.asarray(Image.open(datalist.parent / e["image"]).convert("RGB"), dtype=np.float64).reshape(-1, 3) / 255.0 for e in engine.data["training"]]
    )
    np.testing.assert_allclose(mean.numpy(), pixels.mean(0), atol=1e-6)
    np.testing.assert_allclose(std.numpy(), pixels.std(0), atol=1e-6)


def test_style_figure_writes_a_png_and_refuses_unequal_batches(tmp_path):
    """The site-local CSE figure (original / restyled / hybrid rows) is a PNG; batches of different shapes are
    refused before anything is drawn."""
    from fedseg.plots.pathfl_figures import save_style_figure

    x = torch.rand(2, 3, 12, 12)
    path = save_style_figure(x, x.flip(-1), 0.5 * x, tmp_path / "figs" / "pathfl_cse_examples.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="equally shaped"):
        save_style_figure(x, x[:1], x, tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()
