"""The real-size corpus's builders (benchmarks/real_size.py), checked at their tiny sizes.

Every entry is built from its tiny config and run eagerly, through torch.export ->
``EGraph.from_fx`` -> saturate -> extract, and through ``torch.compile`` with the egraph
backend, with validation raising: the builders, their inputs and the wrappers work, and
each architecture goes through the pipeline without a fallback. The published sizes are
for benchmarks only (a Llama-3.2-1B-shaped decoder and Stable Diffusion's UNet do
not belong in a test run). The whole module is skipped when transformers or diffusers is
not installed.
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

