"""Memory formats a program asks for are kept: equal in value to their operand, they are
the layout its author chose for speed (kornia's SSIM converts both images to
channels-last before its depthwise convolutions; PyTorch's performance guide converts a
convolutional network's input), and dropping them made kornia's SSIM loss 1.7x slower
than eager on this CPU."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from compiler.compile import default_cost, make_backend
from egraph import EGraph
from egraph.rules import load_rules
from egraph.term import parse, to_sexpr

CL = torch.channels_last


class _ConvolutionLayouts(TorchDispatchMode):
    """Whether each convolution a program runs reads a channels-last input."""

    def __init__(self):
        super().__init__()
        self.channels_last: list[bool] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default:
            self.channels_last.append(args[0].is_contiguous(memory_format=CL)
                                      and not args[0].is_contiguous())
        return func(*args, **(kwargs or {}))


def _layouts(program, *inputs) -> list[bool]:
    with _ConvolutionLayouts() as mode, torch.no_grad():
        program(*inputs)
    return mode.channels_last


class GaussianSSIM(nn.Module):
    """kornia's ``metrics.ssim`` in form: channels-last images, a separable Gaussian
    window applied per channel (reflect padding, a depthwise convolution of an expanded
    kernel), the SSIM map made contiguous again and averaged."""

    def __init__(self, window: int = 7, sigma: float = 1.5):
        super().__init__()
        self.window, self.sigma = window, sigma

    def blur(self, x):
        c, k = x.shape[1], self.window
        t = torch.arange(k, dtype=x.dtype) - k // 2
        kernel = torch.exp(-t.pow(2.0) / (2 * self.sigma ** 2))
        kernel = kernel / kernel.sum()
        for shape, pad in (((1, 1, 1, k), [k // 2, k // 2, 0, 0]),
                           ((1, 1, k, 1), [0, 0, k // 2, k // 2])):
            weight = kernel.reshape(shape).expand(c, -1, -1, -1)
            x = F.conv2d(F.pad(x, pad, mode="reflect"), weight, groups=c)
        return x

    def forward(self, a, b):
        a = a.contiguous(memory_format=CL)
        b = b.contiguous(memory_format=CL)
        mu_a, mu_b = self.blur(a), self.blur(b)
        var_a = self.blur(a * a) - mu_a ** 2
        var_b = self.blur(b * b) - mu_b ** 2
        cov = self.blur(a * b) - mu_a * mu_b
        ssim = ((2 * mu_a * mu_b + 1e-4) * (2 * cov + 9e-4)) / (
            (mu_a ** 2 + mu_b ** 2 + 1e-4) * (var_a + var_b + 9e-4))
        return ssim.to(memory_format=torch.contiguous_format).mean()


class ChannelsLastNet(nn.Module):
    """A network that converts its input as the performance guide does, and flattens the
    features (``contiguous().view``, which a channels-last tensor needs)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8 * 16 * 16, 4)

    def forward(self, x):
        y = self.conv(x.to(memory_format=CL)).relu()
        return self.head(y.contiguous().view(y.shape[0], -1)), y


def _images() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(2, 3, 16, 16, generator=g), torch.rand(2, 3, 16, 16, generator=g)


def test_the_channels_last_images_of_an_ssim_stay_channels_last_through_torch_compile():
    model, inputs = GaussianSSIM(), _images()
    torch._dynamo.reset()
    backend = make_backend(validate="raise")
    compiled = torch.compile(model, backend=backend)
    torch.testing.assert_close(compiled(*inputs), model(*inputs))
    emitted = next(iter(backend.cache.values())).module
    assert _layouts(emitted, *inputs) == _layouts(model, *inputs) == [True] * 10
    assert not any(r.fell_back for r in backend.reports)


def test_a_memory_format_through_torch_export_keeps_its_layout_and_outputs_theirs():
    model, x = ChannelsLastNet().eval(), _images()[0]
    program = torch.export.export(model, (x,))
    optimised = EGraph.from_fx(program, (x,)).saturate(load_rules("all")).extract(
        default_cost((x,)), validate="raise")
    logits, features = optimised(x)
    expected = model(x)
    torch.testing.assert_close(logits, expected[0])
    torch.testing.assert_close(features, expected[1])
    assert _layouts(optimised, x) == [True]
    assert features.stride() == expected[1].stride()  # channels-last, as eager's


def test_a_training_step_through_a_channels_last_conversion_has_eager_gradients():
    torch.manual_seed(0)
    model, x = ChannelsLastNet(), _images()[0]
    ours = torch.compile(copy.deepcopy(model), backend=make_backend(validate="raise"))
    for run in (ours, model):
        logits, features = run(x)
        (logits.square().mean() + features.mean()).backward()
    for a, b in zip(ours.parameters(), model.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_clone_in_a_layout_is_kept_and_a_layout_literal_reads_back():
    def f(x):
        return torch.clone(x * 2, memory_format=CL) + 1

    x = _images()[0]
    optimised = EGraph.from_fx(torch.fx.symbolic_trace(f), (x,)).saturate(
        load_rules("all")).extract(default_cost((x,)), validate="raise")
    out = optimised(x)
    torch.testing.assert_close(out, f(x))
    assert out.stride() == f(x).stride()
    term = parse("(to_layout x #layout:channels_last)")
    assert parse(to_sexpr(term)) == term


SPELLINGS = {
    "zeros_like": lambda x: torch.zeros_like(x, memory_format=CL) + x,
    "full_like": lambda x: torch.full_like(x, 2.0, memory_format=CL) * x,
    "dtype_method": lambda x: x.double(memory_format=CL) * 2,
    "to_dtype_and_format": lambda x: x.to(torch.float64, memory_format=CL).sum(1),
    "channels_last_3d": lambda x: x.unsqueeze(2).contiguous(
        memory_format=torch.channels_last_3d) + 1,
    "contiguous_again": lambda x: (x.to(memory_format=CL) * 3).contiguous().view(2, -1),
}


@pytest.mark.parametrize("how", ["symbolic_trace", "export"])
@pytest.mark.parametrize("name", SPELLINGS)
def test_each_spelling_of_a_memory_format_gives_eager_values_and_strides(name, how):
    f, x = SPELLINGS[name], _images()[0]
    program = torch.fx.symbolic_trace(f)
    if how == "export":
        program = torch.export.export(program, (x,))
    optimised = EGraph.from_fx(program, (x,)).saturate(load_rules("all")).extract(
        default_cost((x,)), validate="raise")
    got, expected = optimised(x), f(x)
    torch.testing.assert_close(got, expected)
    assert got.stride() == expected.stride()


class OneChannelPatches(nn.Module):
    """kornia's HardNet in form, in training: one-channel patches converted to
    channels-last (a tensor already contiguous in both formats, whose strides only ``to``
    changes), convolutions, batch norm and dropout, whose mask follows memory order."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8, affine=False),
            nn.ReLU(), nn.Dropout(0.3), nn.Conv2d(8, 4, 3, bias=False))

    def forward(self, x):
        return self.features(x.to(memory_format=CL)).flatten(1)


def test_one_channel_patches_keep_their_format_and_their_dropout_masks():
    torch.manual_seed(0)
    model, x = OneChannelPatches(), torch.rand(4, 1, 8, 8)
    torch._dynamo.reset()
    backend = make_backend(validate="raise")
    compiled = torch.compile(copy.deepcopy(model), backend=backend)
    torch.manual_seed(1)
    got = compiled(x)
    torch.manual_seed(1)
    torch.testing.assert_close(got, model(x))
    assert not any(r.fell_back for r in backend.reports)


class _AudioEncoderStart(nn.Module):
    """Whisper's encoder as transformers writes it, cut to its first block: convolutions
    over (batch, channels, frames), their output permuted to (batch, frames, channels)
    and the position embedding added, then a pre-norm residual block."""

    def __init__(self, channels=16, frames=32):
        super().__init__()
        self.conv = nn.Conv1d(8, channels, 3, padding=1)
        self.embed_positions = nn.Parameter(torch.randn(frames, channels))
        self.norm = nn.LayerNorm(channels)
        self.fc = nn.Linear(channels, channels)
        self.final = nn.LayerNorm(channels)

    def forward(self, features):
        hidden = F.gelu(self.conv(features)).permute(0, 2, 1)
        hidden = hidden + self.embed_positions
        hidden = hidden + self.fc(self.norm(hidden))
        return self.final(hidden)


def test_a_sum_with_a_permuted_operand_is_laid_out_row_major():
    # an elementwise result takes its first operand's layout: the permuted convolution
    # output first kept the residual stream permuted, where a layer norm took 7.4x its
    # time on row-major rows at Whisper-base's 1500 x 512 (the encoder's program through
    # export: 342 -> 315 ms with the sums' operands swapped)
    model, x = _AudioEncoderStart().eval(), torch.randn(1, 8, 32)
    gm = EGraph.from_fx(torch.fx.symbolic_trace(model), (x,)).saturate(
        load_rules("all"), iter_limit=4).extract(default_cost((x,)))
    sums = []

    class Record(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n.op == "call_function" and n.target in (torch.add, operator.add):
                sums.append(out.is_contiguous())
            return out

    with torch.no_grad():
        out = Record(gm).run(x)
        assert torch.allclose(out, model(x), atol=1e-5)
    assert sums and all(sums)
