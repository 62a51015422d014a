"""The real-size corpus's builders (benchmarks/real_size.py), checked at their tiny sizes.

Every entry is built from its tiny config and run eagerly, through torch.export ->
``EGraph.from_fx`` -> saturate -> extract, and through ``torch.compile`` with the egraph
backend, with validation raising: the builders, their inputs and the wrappers work, and
each architecture goes through the pipeline without a fallback. One tiny cell goes through
benchmarks/speed.py's compile, check and timing, and into its tables. The published sizes
are for benchmarks/speed.py only (a Llama-3.2-1B-shaped decoder and Stable Diffusion's
UNet do not belong in a test run). The whole module is skipped when transformers or
diffusers is not installed.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("diffusers")

from benchmarks import real_size  # noqa: E402
from compiler.compile import default_cost, make_backend  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.rules import load_rules  # noqa: E402

LIMITS = dict(iter_limit=10, node_limit=50_000, time_limit=120.0)
TOL = dict(rtol=1e-4, atol=1e-5)
SEQ = 16


@pytest.fixture(scope="module")
def rules():
    return load_rules("all")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models: one intra-op thread runs them as fast, and no parallel op waits for a
    core another process holds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", real_size.MODELS)
def test_tiny_builds_run_through_export_and_compile(name, rules):
    case = real_size.build(name, batch=1, seq=SEQ, tiny=True)
    model, inputs = case.model, case.inputs
    with torch.no_grad():
        want = model(*inputs)
        program = torch.export.export(model, inputs)
        opt = EGraph.from_fx(program, inputs).saturate(rules, **LIMITS).extract(
            default_cost(inputs), validate="raise")
        assert not opt.meta["egraph_report"].fell_back
        torch.testing.assert_close(opt(*inputs), want, **TOL)
        torch._dynamo.reset()
        backend = make_backend(rules=rules, validate="raise", **LIMITS)
        torch.testing.assert_close(torch.compile(model, backend=backend)(*inputs), want, **TOL)
        torch._dynamo.reset()
    assert backend.reports and not any(r.fell_back for r in backend.reports)


def test_each_entry_copies_a_published_config():
    """The real sizes differ from the tiny ones, and the sequence models take the
    corpus's lengths (the published positions cover 512)."""
    for entry in real_size.REAL_SIZE.values():
        assert entry.source and entry.config() != entry.config(tiny=True), entry.name
        assert set(entry.tiny) <= set(entry.fields) | {"bos_token_id", "eos_token_id"}, entry.name
        positions = entry.fields.get("max_position_embeddings", entry.fields.get("n_positions"))
        if entry.takes_seq and positions is not None:
            assert positions >= max(real_size.SEQUENCES), entry.name


def test_a_cell_of_the_speed_table_and_its_tables():
    """benchmarks/speed.py on one tiny cell through the egraph backend: compiled, checked
    against eager, timed; then the tables it writes."""
    from benchmarks import speed

    cell = speed.run_cell("bert", 1, SEQ, ["egraph"], rounds=1, tiny=True)
    result = cell.entries["egraph"]
    assert result.ok and result.graphs >= 1 and result.ms > 0 and result.first_s > 0
    assert cell.speedup("egraph") > 0
    image = speed.Cell("resnet50", 1, None, eager_ms=4.0,
                       entries={"egraph": speed.Entry(first_s=1.0, difference=0.0, ms=2.0)})
    failed = speed.Cell("vit", 1, None, eager_ms=1.0,
                        entries={"egraph": speed.Entry(error="RuntimeError: no")})
    cells = [cell, image, failed]
    assert "error" in speed.speed_table(cells, ["egraph"])
    means = speed.geomean_table(cells, ["egraph"])
    assert "| 1 x 16 | 2/3 |" in means    # bert and resnet50 (fixed size) at sequence 16
    assert "1.0" in speed.first_call_table(cells, ["egraph"])
    checks = speed.checks_section(cells, ["egraph"])
    assert "vit 1 egraph: RuntimeError: no" in checks and "rewrites used: " in checks
    # the physical limit: the cell's counted matrix FLOPs a second over the peak
    assert cell.matrix_flops > 0
    image.matrix_flops = 4e9  # 4 GFLOP in 2 ms: 2 TFLOP/s, half of a 4 TFLOP/s peak
    limits = speed.limit_table([image, failed], ["egraph"], peak=4e12)
    assert "| resnet50 | 1 | 4.0 | 25% | 50% |" in limits and "| vit | 1 | 0.0 | - |" in limits


@pytest.mark.parametrize("name", real_size.DECODERS)
def test_a_decode_step_against_a_cache_through_our_entry_points(name):
    """benchmarks/speed.py's decode cell (``--decode``) at the tiny size: one new token
    against a 16-token cache, through the egraph backend (no graph break: dynamo traces
    the cache object built in the step) and through export -> from_fx; the outputs (the
    logits, then each layer's keys and values with the new token's appended) are eager's."""
    from benchmarks import speed

    case = real_size.decode_step(name, cached=SEQ, tiny=True)
    with torch.no_grad():
        logits, key, *_ = case.model(*case.inputs)
    assert tuple(logits.shape) == (1, 1, 1000) and key.shape[-2] == SEQ + 1
    cell = speed.run_cell(name, 1, SEQ, ["egraph", "export"], rounds=1, tiny=True,
                          decode=True)
    assert not cell.error, cell.error
    for entry in ("egraph", "export"):
        result = cell.entries[entry]
        assert result.ok and result.breaks == 0 and result.ms > 0, (entry, result)
    for table in (speed.speed_table, speed.geomean_table):
        assert "| 1 x 1 + 16 cached |" in table([cell], ["egraph", "export"])
