"""Convolutions run channels-last where their measured times say it pays: the price of the
choice (``Roofline.channels_last_convolutions``), its emission (one conversion serves the
stack after it), the per-shape times it reads (``extractors.convolution_times``), and the
programs' values, outputs' layouts and gradients."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.compile import capture
from egraph import EGraph
from egraph.rules import load_rules
from extractors import convolution_times as times_module
from extractors.costs import Roofline
from extractors.hardware import HARDWARE

CONVERSION = "memory_format = torch.channels_last"


def _times(row_major: float, channels_last: float):
    """Per-shape times as if measured: every convolution of torch's takes ``row_major``
    seconds over a row-major input and ``channels_last`` over a channels-last one, and
    oneDNN's as long as torch's over a row-major input."""
    return lambda keys: {k: (row_major, channels_last, row_major) for k in keys}


class _InvertedResidual(torch.nn.Module):
    """EfficientNet's block as transformers writes it: a 1 x 1 expansion with
    ``padding="valid"``, a depthwise convolution with ``padding="same"``, SiLUs, a
    squeeze-and-excite (a mean over the image, two 1 x 1 convolutions, a sigmoid scaling
    the channels) and a 1 x 1 projection added to the block's input."""

    def __init__(self, width: int = 8, expanded: int = 24, kernel: int = 3):
        super().__init__()
        nn = torch.nn
        self.expand = nn.Conv2d(width, expanded, 1, padding="valid", bias=False)
        self.depthwise = nn.Conv2d(expanded, expanded, kernel, padding="same",
                                   groups=expanded, bias=False)
        self.reduce = nn.Conv2d(expanded, 4, 1)
        self.restore = nn.Conv2d(4, expanded, 1)
        self.project = nn.Conv2d(expanded, width, 1, padding="valid", bias=False)

    def forward(self, x):
        h = torch.nn.functional.silu(self.expand(x))
        h = torch.nn.functional.silu(self.depthwise(h))
        scale = h.mean(dim=(2, 3), keepdim=True)
        scale = torch.sigmoid(self.restore(torch.nn.functional.silu(self.reduce(scale))))
        return x + self.project(h * scale)


def _network():
    torch.manual_seed(0)
    stem = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
    return torch.nn.Sequential(stem, torch.nn.SiLU(), _InvertedResidual(),
                               _InvertedResidual(kernel=5)).eval()


def _extracted(model, x, cost):
    eg = EGraph.from_fx(torch.fx.symbolic_trace(model), (x,)).saturate(load_rules("all"))
    return eg.extract(cost, validate="raise")


def test_a_stack_of_convolutions_runs_channels_last_from_one_conversion():
    """Where every convolution runs faster over a channels-last input, the program
    converts the first one's input and each later one reads its predecessor's format; the
    values are the source's and the output is contiguous, as the source's was."""
    model, x = _network(), torch.randn(1, 3, 32, 32)
    program = _extracted(model, x, Roofline("cpu", fused=False,
                                            convolution_times=_times(1e-3, 2e-4)))
    assert program.code.count(CONVERSION) == 1, program.code
    assert program.meta["egraph_report"].channels_last == 1
    with torch.no_grad():
        for given in (x, x.contiguous(memory_format=torch.channels_last)):
            out = program(given)
            torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
            assert out.is_contiguous()


@pytest.mark.parametrize("row_major, channels_last", [(1e-3, 1.5e-3), (1e-3, 1e-3)])
def test_no_conversion_where_channels_last_is_not_faster(row_major, channels_last):
    """Slower or as fast over a channels-last input: the conversion's copy is not paid."""
    model, x = _network(), torch.randn(1, 3, 32, 32)
    cost = Roofline("cpu", fused=False, convolution_times=_times(row_major, channels_last))
    assert CONVERSION not in _extracted(model, x, cost).code


def test_without_measured_times_the_program_keeps_its_formats():
    """The shipped profile times no convolution (nor does Inductor's code generation,
    which chooses its own layouts): the program is as extracted."""
    model, x = _network(), torch.randn(1, 3, 32, 32)
    for cost in (Roofline("cpu", fused=False), Roofline("cpu", fused=True,
                                                          convolution_times=_times(1e-3, 0))):
        eg = EGraph.from_fx(torch.fx.symbolic_trace(model), (x,))
        from egraph.extract.program import source_program

        assert cost.channels_last_convolutions(eg, source_program(eg)) == frozenset()


def test_a_residual_sum_over_two_formats_is_priced_against_the_gain():
    """A convolution whose result is added to a row-major tensor of its shape: channels-last
    would make the sum mix formats, which the profile prices per element; a gain smaller
    than that keeps the program row-major, a larger one converts."""
    import dataclasses

    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(16, 16, 1)

        def forward(self, x, skip):
            return self.conv(x) + skip

    model, x, skip = Residual().eval(), torch.randn(1, 16, 64, 64), torch.randn(1, 16, 64, 64)
    mixed = dataclasses.replace(HARDWARE["cpu"], element_seconds=(
        *HARDWARE["cpu"].element_seconds, ("mixed_layout", 1e-8)))  # 0.65 ms for 65536
    eg = EGraph.from_fx(torch.fx.symbolic_trace(model), (x, skip))
    from egraph.extract.program import source_program

    program = source_program(eg)
    small = Roofline(mixed, fused=False, convolution_times=_times(1e-3, 0.8e-3))
    large = Roofline(mixed, fused=False, convolution_times=_times(1e-2, 1e-3))
    assert small.channels_last_convolutions(eg, program) == frozenset()
    assert len(large.channels_last_convolutions(eg, program)) == 1


@settings(max_examples=12, deadline=None)
@given(channels=st.integers(1, 6), out=st.integers(1, 6), kernel=st.sampled_from([1, 2, 3]),
       stride=st.integers(1, 2), depthwise=st.booleans(), size=st.integers(3, 9),
       batch=st.integers(1, 2))
def test_converted_convolutions_compute_the_sources_values(channels, out, kernel, stride,
                                                           depthwise, size, batch):
    """Whatever the shapes, strides and groups, a program whose convolutions run
    channels-last computes what the source does, and returns its layouts."""
    groups = channels if depthwise else 1
    out = channels if depthwise else out
    torch.manual_seed(0)
    first = torch.nn.Conv2d(channels, out, kernel, stride=stride, groups=groups)
    second = torch.nn.Conv2d(out, out, 1)
    model = torch.nn.Sequential(first, torch.nn.ReLU(), second).eval()
    x = torch.randn(batch, channels, size, size)
    program = _extracted(model, x, Roofline("cpu", fused=False,
                                            convolution_times=_times(1e-3, 1e-5)))
    with torch.no_grad():
        got = program(x)
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
        assert got.is_contiguous()


@pytest.fixture
def faster_channels_last(monkeypatch):
    """The backend's default cost reads per-shape times in which channels-last is faster."""
    monkeypatch.setattr(times_module, "measured_convolutions", lambda: _times(1e-3, 2e-4))


def test_the_backend_runs_inference_channels_last_and_says_so(faster_channels_last):
    model, x = _network(), torch.randn(2, 3, 32, 32)
    torch._dynamo.reset()
    with capture() as seen, torch.no_grad():
        out = torch.compile(model, backend="egraph")(x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    reports = [r.extraction for r in seen.reports]
    assert [r.channels_last for r in reports] == [1]
    assert "channels-last: the inputs of 1 convolutions" in str(reports[0])


def test_training_through_converted_convolutions_gives_eagers_gradients(
        faster_channels_last):
    model, x = _network().train(), torch.randn(2, 3, 16, 16)
    torch.manual_seed(1)
    twin = _network().train()
    twin.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    torch.compile(model, backend="egraph")(x).square().mean().backward()
    twin(x).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_per_shape_times_are_measured_once_and_read_back(tmp_path, monkeypatch):
    """A shape is timed once per machine: the times are saved in the cache and read back
    by the next process (here: with the process's memory of them cleared)."""
    monkeypatch.setenv("EGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(times_module, "_measured", {})
    key = ((1, 4, 8, 8), (4, 1, 3, 3), (1, 1), (1, 1), (1, 1), 4)
    first = times_module.convolution_times([key], threads=1)[key]
    assert all(t > 0 for t in first)
    assert list(tmp_path.glob("*-convolutions.json"))
    monkeypatch.setattr(times_module, "_measured", {})

    def refuse(key):
        raise AssertionError("measured again")

    monkeypatch.setattr(times_module, "_time", refuse)
    assert times_module.convolution_times([key], threads=1)[key] == first


def test_only_this_machines_calibration_times_convolutions(monkeypatch):
    """The shipped profile and a profile from a file measure nothing here."""
    for setting, measured in (("builtin", False), ("some-profile.json", False),
                              ("auto", True)):
        monkeypatch.setenv("EGRAPH_CALIBRATION", setting)
        assert (times_module.measured_convolutions() is not None) == measured


def test_the_peak_estimate_follows_the_conversions_as_measured():
    """PeakMemory's replay of the program as emitted, its conversions' copies and the
    convolutions' own temporaries over the new format included, is the peak the
    allocator measures, with the conversions and without (the corpus's small ResNet had
    come out at 0.74 of it with the copies left out)."""
    from backends.fx import build_module
    from compiler.fx import channels_last_convolutions
    from compiler.memory import peak_bytes
    from egraph.extract.program import source_program
    from extractors.peak import peak_of

    model, x = _network(), torch.randn(1, 3, 32, 32)
    cost = Roofline("cpu", fused=False, convolution_times=_times(1e-3, 2e-4))
    eg = EGraph.from_fx(torch.fx.symbolic_trace(model), (x,))
    choice = source_program(eg)
    converted = channels_last_convolutions(eg, cost, choice)
    assert converted
    for convert in (converted, frozenset()):
        program = build_module(eg, choice, channels_last=convert)
        with torch.no_grad():
            program(x)
            assert peak_of(eg, choice, convert) == peak_bytes(program, x)


def test_a_memory_budget_keeps_the_conversions_only_where_their_copies_fit():
    """A 3 x 3 convolution's input copied to channels-last raises the peak: a budget that
    holds the program without the copy gets it without the conversion."""
    from compiler.fx import channels_last_convolutions
    from egraph.extract.program import source_program
    from extractors.peak import peak_of

    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1)).eval()
    x = torch.randn(1, 16, 64, 64)
    cost = Roofline("cpu", fused=False, convolution_times=_times(1e-3, 2e-4))
    eg = EGraph.from_fx(torch.fx.symbolic_trace(model), (x,))
    choice = source_program(eg)
    converted = channels_last_convolutions(eg, cost, choice)
    with_copies, without = peak_of(eg, choice, converted), peak_of(eg, choice)
    assert converted and without < with_copies
    assert channels_last_convolutions(eg, cost, choice, memory_budget=with_copies) == converted
    assert channels_last_convolutions(eg, cost, choice, memory_budget=without) == frozenset()
    program = eg.extract(cost, memory_budget=without, validate="raise")
    assert CONVERSION not in program.code
    assert CONVERSION in eg.extract(cost, validate="raise").code


@pytest.mark.parametrize("faster", ["torch", "oneDNN"])
def test_each_convolution_is_priced_at_its_own_measured_time(faster):
    """torch's and oneDNN's convolutions are priced at their shapes' measured times, not
    by a curve of FLOPs a second (which priced EfficientNet-B0's depthwise convolutions at
    a sixth of their time): the program runs the kernel measured faster."""
    model, x = _network(), torch.randn(1, 3, 32, 32)
    slow, fast = 1e-3, 1e-5
    times = ((fast, fast, slow) if faster == "torch" else (slow, slow, fast))
    cost = Roofline("cpu", fused=False, convolution_times=lambda keys: {k: times for k in keys})
    code = _extracted(model, x, cost).code
    assert ("onednn_conv2d" in code) == (faster == "oneDNN"), code
