"""A model whose weights are on the meta device (benchmarks/scale.py's Llama-2-7B shape, at
its tiny sizes): ingest, saturation and extraction work without values, and validation,
which needs them, refuses clearly. The whole module is skipped without transformers."""

from __future__ import annotations

import doctest

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks import scale  # noqa: E402
from compiler.pipeline import default_cost  # noqa: E402
from compiler.validate import ValidationError  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.rules import load_rules  # noqa: E402

LIMITS = dict(iter_limit=4, node_limit=20_000, time_limit=60.0)


@pytest.fixture(scope="module")
def exported():
    model, inputs = scale.build(2, seq=8, tiny=True)
    with torch.no_grad():
        return torch.export.export(model, inputs), inputs


def test_a_meta_model_goes_through_the_pipeline_without_validation(exported):
    """Its constant subgraphs (the causal mask, the rotary tables) have no values to fold:
    they stay computed, and the program runs on meta inputs as the source does."""
    program, inputs = exported
    eg = EGraph.from_fx(program, inputs).saturate(load_rules("all"), **LIMITS)
    opt = eg.extract(default_cost(inputs), validate="off")
    with torch.no_grad():
        logits = opt(*inputs)
    assert logits.device.type == "meta" and tuple(logits.shape) == (1, 8, 1000)
    assert opt.meta["egraph_report"].used  # rewrites reached the program


def test_validation_of_a_meta_model_names_the_weight_and_the_fix(exported):
    program, inputs = exported
    eg = EGraph.from_fx(program, inputs)
    with pytest.raises(ValidationError, match=r"embed_tokens.weight is on the meta device.*"
                                              r"validate='off'"):
        eg.extract(default_cost(inputs), validate="raise")
    with pytest.warns(UserWarning, match="meta device"):
        kept = eg.extract(default_cost(inputs), validate="strict")
    assert kept.meta["egraph_report"].fell_back


def test_the_scale_benchmark_docstring_examples():
    assert doctest.testmod(scale).failed == 0


def test_compiling_a_meta_model_keeps_it_and_says_why_validation_could_not_run():
    """torch.compile lifts the weights into (fake, meta) inputs: validation's stand-ins
    cannot run the graph's meta constants, and the warning says so and names the fix."""
    model, inputs = scale.build(1, seq=8, tiny=True)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.warns(UserWarning, match="meta device.*validate='off'"):
        logits = torch.compile(model, backend="egraph")(*inputs)
    torch._dynamo.reset()
    assert logits.device.type == "meta" and tuple(logits.shape) == (1, 8, 1000)
