"""The calibrated CPU profile: measured once per machine and thread count, cached on disk,
measured again when what it depends on changes, and read by the default cost model."""

import dataclasses
import json

import pytest
import torch

from compiler.pipeline import default_cost
from egraph import EGraph
from extractors import Roofline, calibration
from extractors.calibration import cpu_profile, load_profile, profile_key, save_profile
from extractors.hardware import HARDWARE, Hardware


def _profile(name="cpu (calibrated, test)", rate=1e11):
    return dataclasses.replace(HARDWARE["cpu"], name=name,
                               rates=(("matmul", ((1e5, rate / 10), (1e9, rate))),))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder, no profile kept in the process, and a calibration that
    counts its calls instead of taking seconds to measure."""
    monkeypatch.setenv("EGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(calibration.ENV, "auto")
    monkeypatch.setattr(calibration, "_profiles", {})
    monkeypatch.setattr(calibration, "busy_machine", lambda threads: None)
    calls = []

    def measured(threads=None, repeat=9):
        calls.append(threads)
        return _profile(f"cpu (calibrated, {threads})")
    monkeypatch.setattr(calibration, "calibrate", measured)
    return tmp_path, calls


def test_the_profile_is_measured_once_and_read_back_from_the_cache(cache):
    folder, calls = cache
    first = cpu_profile(threads=2)
    assert calls == [2] and first.name == "cpu (calibrated, 2)"
    saved = folder / f"{profile_key(2)}.json"
    assert saved.exists()
    calibration._profiles.clear()  # a new process
    assert cpu_profile(threads=2) == first and calls == [2]


def test_another_thread_count_or_torch_version_is_measured_anew(cache, monkeypatch):
    folder, calls = cache
    cpu_profile(threads=2)
    cpu_profile(threads=1)
    assert calls == [2, 1]
    key = profile_key(2)
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert profile_key(2) != key
    calibration._profiles.clear()
    cpu_profile(threads=2)
    assert calls == [2, 1, 2] and len(list(folder.glob("*.json"))) == 3


def test_a_damaged_cached_profile_is_measured_again_with_a_warning(cache):
    folder, calls = cache
    (folder / f"{profile_key(2)}.json").write_text("{not json")
    with pytest.warns(UserWarning, match="measuring the CPU profile again"):
        profile = cpu_profile(threads=2)
    assert calls == [2] and load_profile(folder / f"{profile_key(2)}.json") == profile


def test_a_profile_of_another_calibration_version_is_not_read(tmp_path):
    path = tmp_path / "old.json"
    save_profile(_profile(), path)
    fields = json.loads(path.read_text())
    path.write_text(json.dumps({**fields, "version": 0}))
    with pytest.raises(ValueError, match="old.json is not a hardware profile.*EGRAPH_CALIBRATION"):
        load_profile(path)


def test_another_allocator_is_measured_anew(monkeypatch):
    """What a fresh result of 32 MiB or more costs is the allocator's doing (glibc maps it
    anew; jemalloc, tcmalloc or glibc told not to map keep it): a preloaded allocator or
    malloc's settings name another profile; the same settings, the same one."""
    for name in calibration.ALLOCATOR_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    plain = profile_key(2)
    monkeypatch.setenv("LD_PRELOAD", "libjemalloc.so.2")
    preloaded = profile_key(2)
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "0")
    assert len({plain, preloaded, profile_key(2)}) == 3
    monkeypatch.delenv("MALLOC_MMAP_MAX_")
    assert profile_key(2) == plain


def test_an_unwritable_cache_still_gives_the_measured_profile(cache, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("EGRAPH_CACHE_DIR", str(blocker / "below"))
    with pytest.warns(UserWarning, match="could not be cached.*EGRAPH_CACHE_DIR"):
        assert cpu_profile(threads=2).name == "cpu (calibrated, 2)"


def test_builtin_and_a_profile_file_are_used_as_given(cache, monkeypatch, tmp_path):
    _, calls = cache
    assert cpu_profile(calibration="builtin") is HARDWARE["cpu"]
    path = tmp_path / "elsewhere.json"
    save_profile(_profile("measured elsewhere"), path)
    monkeypatch.setenv(calibration.ENV, str(path))
    assert cpu_profile().name == "measured elsewhere" and calls == []


def test_the_default_cost_prices_with_the_calibrated_profile(cache):
    cost = default_cost((torch.randn(2),))
    assert cost.hardware.name.startswith("cpu (calibrated") and not cost.fused


def _chain():
    """``x @ a @ b`` with x (64, 512), a (512, 512), b (512, 8), all inputs: left to
    right, a large product then a thin one; right to left, a small one then a thin one,
    with an eighth of the FLOPs."""
    from egraph.rules import load_rules

    def chain(x, a, b):
        return x @ a @ b

    inputs = (torch.randn(64, 512), torch.randn(512, 512) / 20, torch.randn(512, 8))
    eg = EGraph.from_fx(torch.fx.symbolic_trace(chain), inputs).saturate(load_rules("all"))
    return eg, chain, inputs


def test_measured_throughput_curves_decide_the_program_where_flops_alone_would_not():
    """Priced at one peak, the order with fewer FLOPs wins; where the curve says small
    products run at a hundredth of the large one's rate, the order with one large product
    wins; the program stays right either way."""
    eg, chain, inputs = _chain()
    peak_only = dataclasses.replace(HARDWARE["cpu"], name="peak only")
    steep = dataclasses.replace(peak_only, name="steep", rates=(
        ("matmul", ((5e5, 1e8), (5e6, 1e8), (3e7, 1e11))),))
    codes = {}
    for profile in (peak_only, steep):
        program = eg.extract(Roofline(profile, fused=False), validate="raise")
        torch.testing.assert_close(program(*inputs), chain(*inputs), rtol=1e-4, atol=1e-3)
        codes[profile.name] = program.code
    assert "torch.mm(a, b)" in codes["peak only"], codes["peak only"]
    assert "torch.mm(x, a)" in codes["steep"], codes["steep"]


def test_compute_time_follows_the_curve_and_the_peak_elsewhere():
    hw = Hardware("two-point", 1e9, 2e9, 1e9, 1e9, 0.0,
                  rates=(("matmul", ((1e4, 1e8), (1e8, 1e9))), ("conv", ((1e6, 5e8),))))
    # below the first point: that point's time, the kernel's fixed cost
    assert hw.compute_time("matmul", 1e2, None) == pytest.approx(1e4 / 1e8)
    assert hw.compute_time("matmul", 1e10, None) == pytest.approx(1e10 / 1e9)  # and above
    assert hw.compute_time("conv2d", 1e7, None) == pytest.approx(1e7 / 5e8)
    assert hw.compute_time("matmul", 1e6, torch.float16) == pytest.approx(1e6 / 2e9)
    assert hw.compute_time("exp", 1e6, None) == pytest.approx(1e6 / 1e9)


def test_calibration_inside_a_compile_times_real_tensors():
    """The first use can come inside torch.compile, under its fake tensor mode, where
    every op takes no time: the calibration measured there once priced a matrix product
    at 1e18 FLOP/s."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        profile = calibration.calibrate(threads=1, repeat=1)
    assert calibration.implausible(profile) is None, profile


def test_an_implausible_measurement_is_not_cached(cache, monkeypatch):
    folder, calls = cache
    monkeypatch.setattr(calibration, "calibrate", lambda threads=None, repeat=9: _profile(
        rate=1e18))
    with pytest.warns(UserWarning, match="matmul at 1e\\+17 per second"):
        assert cpu_profile(threads=2) is HARDWARE["cpu"]
    assert not list(folder.glob("*.json"))


def test_a_busy_machine_is_not_calibrated(cache, monkeypatch):
    """Beside other work every op times as slow as the load makes it (two threads beside
    a busy job priced exp at 30 ns an element and sdpa's setup at 7 ms): the shipped
    profile prices until a quiet process measures."""
    folder, calls = cache
    monkeypatch.setattr(calibration, "busy_machine",
                        lambda threads: "the load average is 3.4 on 2 cores")
    with pytest.warns(UserWarning, match="not calibrating the CPU now: the load average"):
        assert cpu_profile(threads=2) is HARDWARE["cpu"]
    assert calls == [] and not list(folder.glob("*.json"))
    monkeypatch.setattr(calibration, "busy_machine", lambda threads: None)
    calibration._profiles.clear()
    assert cpu_profile(threads=2).name == "cpu (calibrated, 2)" and calls == [2]


def test_the_matrix_curve_is_timed_on_products_that_compute_bounds():
    """The curve prices compute, and the roofline takes the larger of it and the bytes'
    time: a product that memory bounds (one row of GPT-2's 768 x 2304 weights) timed into
    the curve priced every product of a few MFLOP near it seven times over."""
    cpu = HARDWARE["cpu"]
    for m, k, n in calibration.MATMUL_SHAPES:
        moved = 4 * (m * k + k * n + m * n)
        assert cpu.moving(moved) < 2 * m * k * n / cpu.matrix_fp32, (m, k, n)


def test_a_product_by_one_row_is_priced_by_the_few_rows_curve():
    """A decode step's projection (one row of a large weight) and a prompt's (many rows)
    choose their kernels by different curves: here oneDNN's inner product is measured
    faster at one row and slower in the compute curve, as on one CPU (68 us against
    torch's 108 for GPT-2's one-row 768 x 2304)."""
    from egraph.rules import load_rules

    rows_curve = ((1e5, 1e10), (1e8, 1e10))
    profile = dataclasses.replace(HARDWARE["cpu"], name="one-row oneDNN", rates=(
        ("matmul", ((1e5, 1e11), (1e9, 1e11))), ("onednn_linear", ((1e5, 5e10), (1e9, 5e10))),
        ("matmul:rows", rows_curve), ("onednn_linear:rows", tuple(
            (f, 3 * r) for f, r in rows_curve))))
    weight, bias = torch.randn(2304, 768), torch.randn(2304)
    for rows, kernel in ((1, "onednn_linear"), (128, "linear")):
        x = torch.randn(rows, 768)
        gm = torch.fx.symbolic_trace(torch.nn.Linear(768, 2304))
        gm.weight.data, gm.bias.data = weight, bias
        eg = EGraph.from_fx(gm, (x,)).saturate(load_rules("all"))
        program = eg.extract(Roofline(profile, fused=False), validate="raise")
        calls = {getattr(n.target, "__name__", "") for n in program.graph.nodes
                 if n.op == "call_function"}
        other = ({"linear", "onednn_linear"} - {kernel}).pop()
        assert kernel in calls and other not in calls, (rows, calls)
        torch.testing.assert_close(program(x), gm(x), rtol=1e-4, atol=1e-4)


class _NaiveCausalAttention(torch.nn.Module):
    """nanoGPT's slow attention path, as its model.py writes it: the scores masked by a
    registered lower-triangular buffer, then a softmax and the product with the values."""

    def __init__(self, heads: int = 12, width: int = 64, length: int = 128):
        super().__init__()
        self.heads, self.width = heads, width
        self.register_buffer("bias", torch.tril(torch.ones(length, length))
                             .view(1, 1, length, length))

    def forward(self, q, k, v):
        t = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / self.width ** 0.5)
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        return torch.softmax(att, dim=-1) @ v


def test_a_masked_fill_is_priced_at_its_measured_time_and_the_fused_attention_pays():
    """masked_fill branches on every element (0.9 ns an element with a causal mask on a
    2-core Xeon, against 0.09 for a multiply). Priced as a multiply, the written-out
    attention looked cheaper than sdpa, which ran 747 us against its 1035 at GPT-2 small's
    sizes; priced at its measured time, the fused form is chosen."""
    from egraph.rules import load_rules

    def kernels(profile):
        q, k, v = (torch.randn(1, 12, 128, 64) for _ in range(3))
        model = _NaiveCausalAttention()
        eg = EGraph.from_fx(torch.export.export(model, (q, k, v)), (q, k, v))
        program = eg.saturate(load_rules("all")).extract(Roofline(profile, fused=False),
                                                         validate="raise")
        torch.testing.assert_close(program(q, k, v), model(q, k, v), rtol=1e-4, atol=1e-4)
        return {getattr(n.target, "__name__", str(n.target)) for n in program.graph.nodes
                if n.op == "call_function"}

    # (what a 2-core Xeon's calibration measured: its product and attention curves, and a
    # softmax at 0.44 ns an element)
    base = dataclasses.replace(HARDWARE["cpu"], name="calibrated", rates=(
        ("matmul", ((1.3e5, 3.2e10), (2.1e6, 1.27e11), (8.4e6, 1.82e11), (1.5e8, 1.66e11),
                    (6.0e8, 1.49e11), (1.07e9, 1.88e11), (2.15e9, 2.07e11))),
        ("attention", ((1.6e4, 1.03e9), (5.0e7, 1.01e11), (8.1e8, 1.27e11)))))
    unmeasured = dataclasses.replace(base, element_seconds=tuple(
        (op, 0.44e-9 if op == "softmax" else s) for op, s in base.element_seconds
        if op != "masked_fill"))
    measured = dataclasses.replace(base, element_seconds=(
        *unmeasured.element_seconds, ("masked_fill", 0.9e-9)))
    assert "masked_fill" in kernels(unmeasured)
    fused = kernels(measured)
    assert "masked_fill" not in fused and any("attention" in k for k in fused), fused


def _caches(root, siblings, caches):
    """A Linux description of one CPU's caches under ``root``: ``caches`` are ``(level,
    size, the CPUs sharing it)``; ``siblings`` the hardware threads of its core."""
    (root / "topology").mkdir(parents=True)
    (root / "topology" / "thread_siblings_list").write_text(f"{siblings}\n")
    for i, (level, size, shared) in enumerate(caches):
        index = root / "cache" / f"index{i}"
        index.mkdir(parents=True)
        for name, text in (("level", level), ("size", size), ("shared_cpu_list", shared)):
            (index / name).write_text(f"{text}\n")
    return str(root / "cache")


@pytest.mark.parametrize("siblings, caches, private", [
    # one hardware thread a core (this machine): the L2, not the L3 both cores share
    ("0", [(1, "48K", "0"), (1, "32K", "0"), (2, "1024K", "0"), (3, "32768K", "0-1")],
     1 << 20),
    # two hardware threads a core share its L2, which is still the core's own
    ("0,64", [(1, "32K", "0,64"), (2, "2048K", "0,64"), (3, "32M", "0-127")], 2 << 20),
    # a CPU whose every cache is shared: nothing of a core's own
    ("0", [(3, "16384K", "0-7")], None),
])
def test_the_private_cache_is_the_largest_one_core_does_not_share(
        tmp_path, siblings, caches, private):
    from extractors.hardware import private_cache_bytes

    assert private_cache_bytes(_caches(tmp_path, siblings, caches)) == private


def test_a_calibrated_profile_runs_from_cache_only_what_fits_one_cores_own():
    # inside a real-size program a value passed between kernels comes from memory: the
    # shared cache is swept by the kernels between its writer and its reader
    from extractors.hardware import CACHE_BYTES, measure_cpu, private_cache_bytes

    hw = measure_cpu(1)
    assert hw.cache_bytes == (private_cache_bytes() or CACHE_BYTES)
    past = 4 * hw.cache_bytes
    assert hw.moving(past) == pytest.approx(past / hw.bandwidth)


def test_an_eager_calls_fixed_cost_is_priced_in_own_emission_only():
    """A batch norm's call costs more than a launch whatever its size (it computes a scale
    and a shift per channel first: 3.7 us on a 2-core EPYC where an add takes 1.2): the
    profile's measured ``call_seconds`` are paid by each call own emission makes, not by
    Inductor's generated code, which makes no such call."""
    import torch.nn.functional as F

    def norm(x, mean, var):
        return F.batch_norm(x, mean, var, None, None, False, 0.1, 1e-5)

    x, stats = torch.randn(1, 8, 4, 4), torch.rand(8) + 0.5
    eg = EGraph.from_fx(torch.fx.symbolic_trace(norm), (x, stats, stats))
    measured = dataclasses.replace(HARDWARE["cpu"], call_seconds=(("batch_norm", 5e-6),))
    from egraph.extract.program import source_program

    cid, = eg.classes_with_op("batch_norm")
    node = source_program(eg)[cid]
    priced = {(profile.name, fused): Roofline(profile, fused=fused).node_cost(eg, cid, node)
              for profile in (HARDWARE["cpu"], dataclasses.replace(measured, name="measured"))
              for fused in (False, True)}
    assert priced["measured", False] == pytest.approx(priced["cpu", False] + 5e-6)
    assert priced["measured", True] == priced["cpu", True]


def test_a_means_fixed_cost_is_weighed_with_the_number_its_alternative_divides_by():
    """A mean's call costs 2.4 us beyond a launch (it makes a tensor of the count it
    divides by); ``sum(x) / n`` pays the same for its number: priced with the mean's cost
    alone, the sum and division looked cheaper on small rows, where they run slower (4.6
    us against 3.8 on a 2-core EPYC)."""
    from egraph.rules import load_rules

    x = torch.randn(4, 16)
    eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: x.mean(-1)), (x,))
    eg.saturate(load_rules("all"))
    launch = HARDWARE["cpu"].launch_overhead

    def program(calls):
        profile = dataclasses.replace(HARDWARE["cpu"], call_seconds=calls)
        return eg.extract(Roofline(profile, fused=False), validate="raise").code

    assert "torch.mean" not in program((("mean", 2 * launch),))
    assert "torch.mean" in program((("mean", 2 * launch), ("number_operand", 2 * launch)))
