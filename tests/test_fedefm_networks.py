"""FedEFM's ViT foundation backbone and its hand-over to a MONAI UNETR."""

from __future__ import annotations

import pytest
import torch

import torch.nn.functional as F

from fedseg.foundation.networks import (
    INPUT_MEAN,
    INPUT_STD,
    PATCH_CONV,
    PROFILES,
    ViTClassifier,
    build_vit,
    fold_input_standardisation,
    unetr_from_foundation,
    unetr_key_map,
)

# small enough for a shared 2-core machine: 64 px -> 4 x 4 = 16 tokens
SMALL = dict(img_size=64, hidden_size=48, mlp_dim=96, num_heads=3)


def test_tokens_and_logits_shapes_and_the_logits_are_the_vits_own():
    net = ViTClassifier(in_channels=1, num_classes=5, num_layers=2, init_seed=0, **SMALL).eval()
    x = torch.randn(3, 1, 64, 64)
    logits, tokens = net.forward_features(x)
    assert logits.shape == (3, 5) and tokens.shape == (3, 16, 48) and net.num_tokens == 16
    # the unrolled forward is MONAI's, on the standardised input
    torch.testing.assert_close(net(x), net.vit((x - INPUT_MEAN) / INPUT_STD)[0])
    assert (INPUT_MEAN, INPUT_STD) == (0.5, 0.25)
    other = ViTClassifier(in_channels=1, num_classes=5, num_layers=2, init_seed=0, input_mean=0.0, input_std=1.0, **SMALL)
    torch.testing.assert_close(other.eval()(x), net.vit(x)[0])
    with pytest.raises(ValueError, match="input_std must be positive"):
        ViTClassifier(input_std=0.0, **SMALL)
    # the tokens are LayerNorm outputs: zero mean and unit variance (before the affine, which starts at identity)
    torch.testing.assert_close(tokens.mean(-1), torch.zeros(3, 16), atol=1e-5, rtol=0)
    # a non-square input keeps row-major patch order: 64 x 32 -> 4 x 2 tokens
    rect = ViTClassifier(in_channels=1, num_classes=2, num_layers=1, img_size=(64, 32), hidden_size=48, mlp_dim=96, num_heads=3)
    assert rect.forward_features(torch.randn(1, 1, 64, 32))[1].shape == (1, 8, 48)


def test_token_is_its_patch_without_mixing_layers():
    # with no transformer blocks, token r * W/p + c depends only on patch (r, c)
    net = ViTClassifier(in_channels=1, num_classes=2, num_layers=0, init_seed=1, **SMALL).eval()
    x = torch.randn(1, 1, 64, 64)
    y = x.clone()
    y[..., 16:32, 48:64] += 1.0  # patch row 1, column 3 -> token 7
    changed = (net.forward_features(x)[1] - net.forward_features(y)[1]).abs().sum(-1)[0]
    assert changed.nonzero().flatten().tolist() == [7]


def test_init_seed_reproduces_weights_and_leaves_global_rng():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = ViTClassifier(num_layers=1, init_seed=5, **SMALL)
    after = torch.rand(1)
    b = ViTClassifier(num_layers=1, init_seed=5, **SMALL)
    assert torch.equal(before, after)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


def test_profiles():
    assert PROFILES["paper"] == dict(img_size=224, patch_size=16, hidden_size=768, mlp_dim=3072, num_layers=12, num_heads=12)
    net = build_vit("tiny", in_channels=1, num_classes=4, img_size=64)
    assert net.img_size == (64, 64) and net.num_layers == PROFILES["tiny"]["num_layers"]
    assert net.mlp_dim == 4 * net.hidden_size
    with pytest.raises(ValueError, match="unknown ViT profile"):
        build_vit("huge", 1, 2)
    with pytest.raises(ValueError, match="multiple of the patch"):
        ViTClassifier(img_size=72, **{k: v for k, v in SMALL.items() if k != "img_size"})


def test_key_map_drops_exactly_the_class_token_and_head():
    net = ViTClassifier(num_layers=2, **SMALL)
    mapping, dropped = unetr_key_map(net.state_dict())
    assert sorted(dropped) == ["vit.classification_head.bias", "vit.classification_head.weight", "vit.cls_token"]
    assert all(dst == src for src, dst in mapping.items())  # the wrapper's prefix is the UNETR's attribute
    bare, _ = unetr_key_map(net.vit.state_dict())
    assert sorted(bare.values()) == sorted(mapping.values())
    with pytest.raises(ValueError, match="not a MONAI ViT tensor"):
        unetr_key_map({"decoder.weight": torch.zeros(1)})


def test_unetr_encoder_equals_the_foundation_after_loading():
    net = ViTClassifier(in_channels=1, num_classes=3, num_layers=12, init_seed=2, **SMALL)
    with torch.no_grad():  # move off MONAI's initial values so an equal tensor is a copied one
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    state = net.state_dict()
    unetr, loaded = unetr_from_foundation(state, out_channels=2, img_size=64, num_heads=3, feature_size=8, init_seed=0)
    encoder = {k for k in unetr.state_dict() if k.startswith("vit.")}
    assert set(loaded) == encoder  # every encoder tensor came from the foundation, nothing else did
    target = unetr.state_dict()
    folded = {PATCH_CONV + ".weight", PATCH_CONV + ".bias"}
    for key in set(loaded) - folded:
        assert torch.equal(target[key], state[key]), key
    # the patch embedding takes the classifier's input standardisation in: W / std, b - mean / std * sum(W)
    w, b = state[PATCH_CONV + ".weight"], state[PATCH_CONV + ".bias"]
    torch.testing.assert_close(target[PATCH_CONV + ".weight"], w * 4.0)
    torch.testing.assert_close(target[PATCH_CONV + ".bias"], b - 2.0 * w.sum(dim=(1, 2, 3)))
    # the copy is a copy: training the UNETR leaves the foundation alone
    with torch.no_grad():
        unetr.vit.norm.weight.add_(1.0)
    assert not torch.equal(unetr.vit.norm.weight, net.vit.norm.weight)
    # the UNETR's encoder is the foundation's transformer run on the patch tokens alone (no class token)
    with torch.no_grad():
        unetr.vit.norm.weight.sub_(1.0)
        x = torch.rand(2, 1, 64, 64)  # a [0, 1] image, as the segmentation pipeline gives it
        h = net.vit.patch_embedding((x - INPUT_MEAN) / INPUT_STD)
        for block in net.vit.blocks:
            h = block(h)
        torch.testing.assert_close(unetr.eval().vit(x)[0], net.vit.norm(h))


def test_unetr_forward_shape():
    state = ViTClassifier(in_channels=3, num_classes=2, num_layers=12, **SMALL).state_dict()
    unetr, _ = unetr_from_foundation(state, out_channels=4, img_size=64, num_heads=3, feature_size=8)
    with torch.no_grad():
        assert unetr.eval()(torch.randn(2, 3, 64, 64)).shape == (2, 4, 64, 64)


def test_mismatches_raise_clear_errors():
    state = ViTClassifier(in_channels=1, num_classes=2, num_layers=12, **SMALL).state_dict()
    # the foundation saw 64 px (16 tokens); a 96 px UNETR has 36 position embeddings
    with pytest.raises(ValueError, match=r"position_embeddings.*16 patch tokens.*96x96 UNETR input has 36"):
        unetr_from_foundation(state, out_channels=2, img_size=96, num_heads=3, feature_size=8)
    with pytest.raises(ValueError, match="multiples of 16"):
        unetr_from_foundation(state, out_channels=2, img_size=72, num_heads=3, feature_size=8)
    shallow = ViTClassifier(in_channels=1, num_classes=2, num_layers=4, **SMALL).state_dict()
    with pytest.raises(ValueError, match="12 blocks; the foundation has 4.*partial_depth"):
        unetr_from_foundation(shallow, out_channels=2, img_size=64, num_heads=3, feature_size=8)
    big_patch = ViTClassifier(in_channels=1, num_classes=2, num_layers=1, patch_size=32, **SMALL).state_dict()
    with pytest.raises(ValueError, match="16x16 patches"):
        unetr_from_foundation(big_patch, out_channels=2, img_size=64, num_heads=3, feature_size=8)


def test_partial_depth_loads_the_first_blocks_only():
    state = ViTClassifier(in_channels=1, num_classes=2, num_layers=4, init_seed=3, **SMALL).state_dict()
    unetr, loaded = unetr_from_foundation(state, out_channels=2, img_size=64, num_heads=3, feature_size=8, partial_depth=True)
    blocks = {int(k.split(".")[2]) for k in loaded if k.startswith("vit.blocks.")}
    assert blocks == {0, 1, 2, 3}
    assert "vit.norm.weight" in loaded and "vit.patch_embedding.position_embeddings" in loaded
    for key in set(loaded) - {PATCH_CONV + ".weight", PATCH_CONV + ".bias"}:
        assert torch.equal(unetr.state_dict()[key], state[key])
    assert not any(k.startswith("vit.blocks.4.") for k in loaded)


@pytest.mark.parametrize("mean, std", [(0.5, 0.25), (0.0, 1.0), (-1.3, 3.7)])
def test_folded_convolution_equals_the_convolution_of_the_standardised_input(mean, std):
    torch.manual_seed(0)
    weight, bias = torch.randn(5, 3, 4, 4), torch.randn(5)
    x = torch.rand(2, 3, 16, 12)
    folded_w, folded_b = fold_input_standardisation(weight, bias, mean, std)
    expected = F.conv2d((x - mean) / std, weight, bias, stride=4)
    torch.testing.assert_close(F.conv2d(x, folded_w, folded_b, stride=4), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="std must be positive"):
        fold_input_standardisation(weight, bias, 0.0, -1.0)
