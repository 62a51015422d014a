"""Ingest is passes along the data flow: normalise the source, then metadata, then value
ranges, then the build; each reads the one before and never imports a later one."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

from tests.test_layers import _modules, imports

PASSES = ["frontends.fx.tracing", "frontends.fx.functionalise", "frontends.fx.normalise",
          "frontends.fx.mismatch", "frontends.fx.metadata", "frontends.fx.ranges",
          "frontends.fx.terms", "frontends.fx.builder", "frontends.fx.ingest"]
"""Ingest's modules, each after those it may read."""


def test_a_pass_never_imports_a_later_one():
    graph = imports(_modules())
    backwards = sorted(f"{module} -> {target}" for i, module in enumerate(PASSES)
                       for target, _, _ in graph[module] if target in PASSES[i + 1:])
    assert backwards == []


@pytest.mark.parametrize("old, name, new", [
    ("frontends.fx.ingest", "state_kept", "frontends.fx.kept"),
    ("frontends.fx.ingest", "OutputRef", "frontends.fx.source"),
    ("frontends.fx.ingest", "SHAPE_PARAMS", "frontends.fx.terms"),
    ("frontends.fx.ingest", "trace", "frontends.fx.tracing"),
    ("frontends.fx.effects", "attributes_kept", "frontends.fx.kept"),
    ("frontends.fx.effects", "recorded_key", "frontends.fx.recorded"),
])
def test_a_moved_name_still_imports_from_its_old_module_with_a_warning(old, name, new):
    module = importlib.import_module(old)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)
    assert [str(w.message) for w in caught] == [f"{old}.{name} moved to {new}.{name}"]
    assert all(w.category is DeprecationWarning for w in caught)
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_an_update_through_a_view_is_ingested_again_as_the_exported_program():
    """The retry after the builder meets an update a view shares: torch.export's
    functional program, without the guards of a program the user exported."""
    from egraph import EGraph
    from extractors import AstSize

    class Scaled(torch.nn.Module):
        def forward(self, x):
            h = x * 2
            h[:, :1].mul_(3)
            return h + 1

    x = torch.randn(2, 3)
    eg = EGraph.from_fx(Scaled(), (x,))
    assert isinstance(eg.fx.module, torch.nn.Module) and eg.fx.guards is None
    assert any("slice_scatter" in str(n.target) for n in eg.fx.graph_module.graph.nodes)
    torch.testing.assert_close(eg.extract(AstSize())(x), Scaled()(x))
