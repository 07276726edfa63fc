"""FeatureUNet's layouts (``variant``): the FedEvi authors' "three_conv_nearest" U-Net against references written
from its description, and the default "two_conv_transpose" unchanged (same modules, same initial weights)."""

from __future__ import annotations

import importlib.util
import inspect
import math
import subprocess
from pathlib import Path

import pytest
import torch
from monai.networks.blocks import Convolution
from torch import nn

from fedseg.alignment.strata import stratum_names, stratum_of, stratum_outputs
from fedseg.networks import UNET_VARIANTS, FeatureAlignment, FeatureUNet
from fedseg.networks.partition import head_state_keys, normalisation_state_keys
from fedseg.networks.unet import resolve_norm

NEW = "three_conv_nearest"
SMALL = dict(in_channels=3, out_channels=2, channels=(4, 8, 16))
REPO = Path(__file__).resolve().parents[1]
UNET_PATH = "custom/fedseg/networks/unet.py"


def _conv(k: int, cin: int, cout: int, dims: int, affine: bool) -> int:
    """Parameters of one conv (+ norm): k^dims * cin * cout weights, cout biases, 2 * cout for an affine norm."""
    return k**dims * cin * cout + cout + (2 * cout if affine else 0)


def _expected_params(in_channels, out_channels, channels, dims=2, affine=False) -> int:
    """"three_conv_nearest"'s parameter count from its description (not from the module tree)."""
    c, total, cin = list(channels), 0, in_channels
    for width in c:  # encoder blocks, then the bottleneck (c[-2] -> c[-1]): three 3x3 convs each
        total += _conv(3, cin, width, dims, affine) + 2 * _conv(3, width, width, dims, affine)
        cin = width
    for i in range(len(c) - 2, -1, -1):
        if i != len(c) - 2:  # the deepest up step reads the bottleneck (c[i+1]); the others a 2 c[i+1] decoder map
            total += _conv(3, 2 * c[i + 1], c[i + 1], dims, affine)
        total += _conv(1, c[i + 1], c[i], dims, affine)  # after the nearest upsampling
        total += _conv(3, 2 * c[i], 2 * c[i], dims, affine)  # decoder block on [skip, up]
    return total + _conv(1, 2 * c[0], out_channels, dims, False)  # head: no norm


def _n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------ structure
def test_parameter_count_of_the_fedevi_unet():
    net = FeatureUNet(spatial_dims=2, in_channels=3, out_channels=2, channels=(16, 32, 64, 128, 256), variant=NEW)
    assert _n_params(net) == _expected_params(3, 2, (16, 32, 64, 128, 256)) == 3_179_890
    assert 3.1e6 < _n_params(net) < 3.3e6  # the authors' "3.2 M" at base width 16
    # the default layout is a different network (about 1.9 M)
    assert _n_params(FeatureUNet(channels=(16, 32, 64, 128, 256))) == 1_941_122


@pytest.mark.parametrize("dims,norm", [(2, "instance_affine"), (3, "instance"), (3, "instance_affine")])
def test_parameter_count_other_norms_and_3d(dims, norm):
    net = FeatureUNet(spatial_dims=dims, norm=norm, variant=NEW, **SMALL)
    assert _n_params(net) == _expected_params(3, 2, SMALL["channels"], dims, affine=norm == "instance_affine")


@pytest.mark.parametrize("dims", [2, 3])
def test_shapes_and_feature_names(dims):
    size = 32 if dims == 2 else 16
    spatial = (size,) * dims
    net = FeatureUNet(spatial_dims=dims, variant=NEW, init_seed=0, **SMALL).eval()
    x = torch.rand(2, 3, *spatial)
    logits, feats = net.forward_features(x)
    assert logits.shape == (2, 2, *spatial)
    assert list(feats) == ["enc0", "enc1", "bottleneck", "dec1", "dec0", "decoder_last"] == net.feature_names
    c = SMALL["channels"]
    expected = {"enc0": c[0], "enc1": c[1], "bottleneck": c[2], "dec1": 2 * c[1], "dec0": 2 * c[0], "decoder_last": 2 * c[0]}
    scale = {"enc0": 1, "enc1": 2, "bottleneck": 4, "dec1": 2, "dec0": 1, "decoder_last": 1}
    for name, channels in expected.items():
        assert feats[name].shape == (2, channels, *(s // scale[name] for s in spatial)), name
    assert feats["decoder_last"] is feats["dec0"]
    assert net.depth == 2 and net.channels == [4, 8, 16] and net.variant == NEW
    torch.testing.assert_close(net(x), logits, rtol=0, atol=0)


def test_block_layout_activations_and_nearest_upsampling():
    net = FeatureUNet(variant=NEW, init_seed=1, **SMALL).eval()
    seen = {}

    def keep(name):
        return lambda module, inputs, output: seen.__setitem__(name, (inputs[0], output))

    hooks = [net.encoders[0][k].register_forward_hook(keep(f"enc0.{k}")) for k in range(3)]
    hooks += [net.bottleneck[k].register_forward_hook(keep(f"bottleneck.{k}")) for k in range(3)]
    for k, up in enumerate(net.ups):
        hooks.append(up.project.register_forward_hook(keep(f"project{k}")))
        hooks.append(up.register_forward_hook(keep(f"up{k}")))
    hooks += [dec.register_forward_hook(keep(f"dec{k}")) for k, dec in enumerate(net.decoders)]
    _, feats = net.forward_features(torch.randn(2, 3, 32, 32))
    for h in hooks:
        h.remove()

    # first conv of a block: conv-norm (zero-mean maps, so negatives); the other two end in a ReLU
    for block in ("enc0", "bottleneck"):
        assert seen[f"{block}.0"][1].min() < 0
        assert seen[f"{block}.1"][1].min() >= 0 and seen[f"{block}.2"][1].min() >= 0
    # deepest step: bottleneck -> nearest x2 -> 1x1; the next one first reduces dec1 (2 c_1 -> c_1)
    assert not hasattr(net.ups[0], "reduce") and hasattr(net.ups[1], "reduce")
    assert seen["up0"][0] is feats["bottleneck"]
    assert seen["up1"][0] is feats["dec1"] and feats["dec1"].shape[1] == 2 * SMALL["channels"][1]
    for k, before in ((0, feats["bottleneck"]), (1, net.ups[1].reduce(feats["dec1"]))):
        upsampled, projected = seen[f"project{k}"]
        assert upsampled.shape[-2:] == tuple(2 * s for s in before.shape[-2:])
        # every pixel repeated in a 2x2 block, and that pixel is the input's
        for dy in (0, 1):
            for dx in (0, 1):
                torch.testing.assert_close(upsampled[..., dy::2, dx::2], before, rtol=0, atol=0)
        assert projected.min() >= 0 and net.ups[k].project.conv.kernel_size == (1, 1)
        assert projected is seen[f"up{k}"][1]
    for k in range(2):
        assert seen[f"dec{k}"][0].shape[1] == seen[f"dec{k}"][1].shape[1]  # one 3x3 conv 2 c -> 2 c
        assert seen[f"dec{k}"][1].min() >= 0


def test_the_initialisation_is_an_option_of_its_own():
    """``init`` swaps the initialisation without the layout: Kaiming fan-out weights on the default layout, PyTorch's
    on the reference layout; None keeps each variant's own."""
    def std(net):
        w = net.get_submodule("bottleneck.1.conv").weight.detach().double()  # 256 -> 256, 3x3
        return float(w.std()), w.shape[0] * 9, w.shape[1] * 9

    kaiming_default_layout = FeatureUNet(channels=(64, 256), init_seed=0, init="kaiming_fan_out")
    s, fan_out, _ = std(kaiming_default_layout)
    assert s == pytest.approx(math.sqrt(2 / fan_out), rel=0.02)
    assert all(isinstance(m, nn.ConvTranspose2d) for m in kaiming_default_layout.ups)  # the layout is unchanged
    pytorch_new_layout = FeatureUNet(channels=(64, 256), init_seed=0, variant=NEW, init="pytorch")
    s, _, fan_in = std(pytorch_new_layout)
    assert s == pytest.approx(1 / math.sqrt(3 * fan_in), rel=0.02)
    same = FeatureUNet(channels=(64, 256), init_seed=0, variant=NEW)
    explicit = FeatureUNet(channels=(64, 256), init_seed=0, variant=NEW, init="kaiming_fan_out")
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(), explicit.state_dict().values()))
    default = FeatureUNet(channels=(64, 256), init_seed=0)
    pytorch = FeatureUNet(channels=(64, 256), init_seed=0, init="pytorch")
    assert all(torch.equal(a, b) for a, b in zip(default.state_dict().values(), pytorch.state_dict().values()))
    with pytest.raises(ValueError, match="init must be one of"):
        FeatureUNet(channels=(8, 16), init="xavier")


def test_kaiming_fan_out_initialisation():
    net = FeatureUNet(in_channels=3, out_channels=2, channels=(64, 256), variant=NEW, norm="instance_affine", init_seed=0)
    default = FeatureUNet(in_channels=3, out_channels=2, channels=(64, 256), norm="instance_affine", init_seed=0)
    for module in ("bottleneck.0.conv", "bottleneck.1.conv"):  # 64 -> 256 (fan_in != fan_out) and 256 -> 256
        w = net.get_submodule(module).weight.detach().double()
        cout, cin, k, _ = w.shape
        fan_out, fan_in = cout * k * k, cin * k * k
        assert abs(w.mean()) < 0.02 * math.sqrt(2 / fan_out)
        assert w.std() == pytest.approx(math.sqrt(2 / fan_out), rel=0.02)
        assert abs(w.std() - math.sqrt(2 / fan_in)) > 0.1 * math.sqrt(2 / fan_in) or fan_in == fan_out
        # PyTorch's default (kaiming_uniform, a = sqrt(5)): std 1 / sqrt(3 fan_in), as the default layout keeps
        assert abs(w.std() - 1 / math.sqrt(3 * fan_in)) > 0.15 / math.sqrt(3 * fan_in)  # 22 % and 59 % apart
        w_default = default.get_submodule(module).weight.detach().double()
        assert w_default.std() == pytest.approx(1 / math.sqrt(3 * fan_in), rel=0.02)
        # normal, not uniform: kurtosis 3 (a uniform's is 1.8)
        z = (w - w.mean()) / w.std()
        assert (z**4).mean() == pytest.approx(3.0, abs=0.1)
        # biases: PyTorch's default, uniform within 1 / sqrt(fan_in)
        b = net.get_submodule(module).bias.detach()
        assert b.abs().max() <= 1 / math.sqrt(fan_in) and b.abs().max() > 0
    for name, m in net.named_modules():
        if isinstance(m, nn.InstanceNorm2d):
            assert torch.equal(m.weight, torch.ones_like(m.weight)) and torch.equal(m.bias, torch.zeros_like(m.bias)), name
    # every conv, head included: zero-mean normal with the fan-out std (loosely: small layers)
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 3 + 3 + 1 + 1 + 1  # encoder, bottleneck, up 1x1, decoder, head
    for m in convs:
        w = m.weight.detach().double()
        fan_out = w.shape[0] * w[0, 0].numel()
        assert w.std() == pytest.approx(math.sqrt(2 / fan_out), rel=0.25 if w.numel() < 2000 else 0.05)


def test_init_seed_determinism_and_global_rng():
    before = torch.get_rng_state()
    a = FeatureUNet(variant=NEW, init_seed=3, **SMALL).state_dict()
    b = FeatureUNet(variant=NEW, init_seed=3, **SMALL).state_dict()
    c = FeatureUNet(variant=NEW, init_seed=4, **SMALL).state_dict()
    assert torch.equal(torch.get_rng_state(), before)
    assert list(a) == list(b) == list(c)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(not torch.equal(a[k], c[k]) for k in a if k.endswith("conv.weight") or k.startswith("head."))
    # without a seed the global RNG drives the initial weights, as for the default layout
    torch.manual_seed(11)
    d = FeatureUNet(variant=NEW, **SMALL).state_dict()
    torch.manual_seed(11)
    e = FeatureUNet(variant=NEW, **SMALL).state_dict()
    assert all(torch.equal(d[k], e[k]) for k in d)


# ------------------------------------------------------------------------------------ default layout unchanged
class _DefaultReference(nn.Module):
    """The "two_conv_transpose" layout as it was before ``variant`` existed, rebuilt here from MONAI blocks."""

    def __init__(self, spatial_dims, in_channels, out_channels, channels, norm, act, dropout, init_seed, feature_alignment):
        super().__init__()
        norm = resolve_norm(norm)

        def double(cin, cout, p):
            return nn.Sequential(
                Convolution(spatial_dims, cin, cout, kernel_size=3, norm=norm, act=act, dropout=p),
                Convolution(spatial_dims, cout, cout, kernel_size=3, norm=norm, act=act),
            )

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            encoders, cin = [], in_channels
            for c in channels[:-1]:
                encoders.append(double(cin, c, 0.0))
                cin = c
            self.encoders = nn.ModuleList(encoders)
            self.bottleneck = double(channels[-2], channels[-1], dropout)
            up = nn.ConvTranspose2d if spatial_dims == 2 else nn.ConvTranspose3d
            ups, decoders = [], []
            for i in range(len(channels) - 2, -1, -1):
                ups.append(up(channels[i + 1], channels[i], kernel_size=2, stride=2))
                decoders.append(double(2 * channels[i], channels[i], dropout))
            self.ups, self.decoders = nn.ModuleList(ups), nn.ModuleList(decoders)
            self.head = (nn.Conv2d if spatial_dims == 2 else nn.Conv3d)(channels[0], out_channels, kernel_size=1)
            if feature_alignment:
                self.bottleneck_alignment = FeatureAlignment()


DEFAULT_CASES = [
    dict(spatial_dims=2, in_channels=3, out_channels=2, channels=(16, 32, 64, 128, 256), norm="instance", act="relu",
         dropout=0.0, feature_alignment=False),
    dict(spatial_dims=3, in_channels=1, out_channels=3, channels=(4, 8, 16), norm="instance_affine", act="relu",
         dropout=0.1, feature_alignment=True),
    dict(spatial_dims=2, in_channels=3, out_channels=2, channels=(4, 8), norm="batch", act="relu", dropout=0.0,
         feature_alignment=False),
]


def _assert_same_state(new: dict, old: dict):
    assert list(new) == list(old)
    for k in old:
        assert new[k].dtype == old[k].dtype and torch.equal(new[k], old[k]), k


@pytest.mark.parametrize("args", DEFAULT_CASES)
def test_default_variant_matches_the_original_layout(args):
    reference = _DefaultReference(init_seed=0, **args).state_dict()
    _assert_same_state(FeatureUNet(init_seed=0, **args).state_dict(), reference)
    _assert_same_state(FeatureUNet(init_seed=0, variant="two_conv_transpose", **args).state_dict(), reference)
    assert FeatureUNet(**args).variant == "two_conv_transpose" == UNET_VARIANTS[0]


def _unet_before_variants():
    """``unet.py`` as committed before ``variant`` existed, loaded as a module (``None`` without git history)."""
    def git(*cmd):
        return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True, timeout=30)

    try:
        added = git("log", "--format=%H", "-S", "UNET_VARIANTS", "--", UNET_PATH)
    except (OSError, subprocess.SubprocessError):
        return None
    if added.returncode != 0:
        return None
    commits = added.stdout.split()
    revision = f"{commits[-1]}^" if commits else "HEAD"  # the parent of the commit that added it; or not committed yet
    source = git("show", f"{revision}:{UNET_PATH}")
    if source.returncode != 0 or "UNET_VARIANTS" in source.stdout:
        return None
    spec = importlib.util.spec_from_loader("fedseg.networks._unet_before_variants", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "fedseg.networks"  # its relative import of feature_alignment
    exec(compile(source.stdout, f"{revision}:{UNET_PATH}", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("args", DEFAULT_CASES)
def test_default_variant_matches_the_committed_code(args):
    old = _unet_before_variants()
    if old is None:
        pytest.skip("no git history with unet.py before its variants")
    _assert_same_state(FeatureUNet(init_seed=0, **args).state_dict(), old.FeatureUNet(init_seed=0, **args).state_dict())


# ------------------------------------------------------------------------------------ methods' helpers
def test_fedrep_heads_and_fedbn_norms():
    net = FeatureUNet(variant=NEW, norm="instance_affine", **SMALL)
    keys = list(net.state_dict())
    assert head_state_keys(net, "conv1x1") == ["head.weight", "head.bias"]
    last = len(net.decoders) - 1
    assert head_state_keys(net, "last_block") == [k for k in keys if k.startswith(f"decoders.{last}.")] + ["head.weight", "head.bias"]
    assert head_state_keys(net, "last_block")[:4] == [f"decoders.{last}.conv.weight", f"decoders.{last}.conv.bias",
                                                      f"decoders.{last}.adn.N.weight", f"decoders.{last}.adn.N.bias"]
    norms = normalisation_state_keys(net)
    assert norms == [k for k in keys if ".adn.N." in k]
    n_units = 3 * 3 + 1 + 2 + 2  # triple convs (2 encoders + bottleneck), ups (1 + 2 convs), 2 decoder convs
    assert len(norms) == 2 * n_units
    assert normalisation_state_keys(FeatureUNet(variant=NEW, **SMALL)) == []  # MONAI's instance norm: no entries


@pytest.mark.parametrize("channels", [(4, 8), (4, 8, 16, 32)])
def test_pathfl_strata_cover_every_entry(channels):
    net = FeatureUNet(variant=NEW, in_channels=3, out_channels=2, channels=channels, feature_alignment=True)
    depth = len(channels) - 1
    by_stratum = {n: [] for n in stratum_names(depth)}
    for key in net.state_dict():
        s = stratum_of(key, depth)
        if s is None:
            assert key.startswith("bottleneck_alignment.")
        else:
            by_stratum[s].append(key)
    assert all(by_stratum.values()), {k: len(v) for k, v in by_stratum.items()}
    if depth > 1:  # ups[1]'s 3x3 reduce conv belongs with the decoder block it feeds
        assert "ups.1.reduce.conv.weight" in by_stratum[f"dec{depth - 2}"]
    x = torch.rand(1, 3, 2**depth * 4, 2**depth * 4)
    outputs = stratum_outputs(net, x)
    assert list(outputs) == stratum_names(depth)
    assert outputs["dec0"].shape[1] == 2 * channels[0] and outputs["head"].shape == (1, 2, *x.shape[-2:])


def test_feature_alignment_aligns_the_bottleneck_the_decoder_sees():
    """(Weights and scripting with the layer: tests/test_pathfl_math.py, both variants.)"""
    aligned = FeatureUNet(variant=NEW, init_seed=0, feature_alignment=True, **SMALL)
    x = torch.rand(2, 3, 32, 32)
    aligned.bottleneck_alignment.set_target(1.0, 2.0, at_inference=True)
    aligned.eval()
    _, feats = aligned.forward_features(x)
    torch.testing.assert_close(feats["bottleneck"].mean(), torch.tensor(1.0), atol=1e-4, rtol=0)  # the aligned map


@pytest.mark.parametrize("variant", UNET_VARIANTS)
def test_torchscript(variant):
    net = FeatureUNet(variant=variant, init_seed=0, **SMALL).eval()
    x = torch.rand(1, 3, 32, 32)
    torch.testing.assert_close(torch.jit.script(net)(x), net(x))


def test_mc_dropout_layers():
    net = FeatureUNet(variant=NEW, dropout=0.3, init_seed=0, **SMALL)
    active = [name for name, m in net.named_modules() if isinstance(m, nn.Dropout) and m.p > 0]
    # after the first conv of the bottleneck and of each decoder block, nowhere else
    assert active == ["bottleneck.0.adn.D", "decoders.0.adn.D", "decoders.1.adn.D"]
    x = torch.rand(1, 3, 32, 32)
    assert not torch.allclose(net.train()(x), net(x))
    net.eval()
    torch.testing.assert_close(net(x), net(x), rtol=0, atol=0)
    assert not any(isinstance(m, nn.Dropout) and m.p > 0 for m in FeatureUNet(variant=NEW, **SMALL).modules())


def test_constructor_arguments_are_attributes():
    net = FeatureUNet(variant=NEW, **SMALL)
    for name in inspect.signature(FeatureUNet.__init__).parameters:
        if name != "self":
            assert hasattr(net, name), name  # NVFlare's job export reads constructor arguments back


def test_unknown_variant():
    with pytest.raises(ValueError, match="two_conv_transpose.*three_conv_nearest.*'resnet'"):
        FeatureUNet(variant="resnet", **SMALL)
