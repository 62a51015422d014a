"""Regressions found by running real architectures (benchmarks/models.py) through the
pipeline, each reduced to a small model that needs no ``transformers``."""

from __future__ import annotations

import torch
import torch.nn as nn

from compiler.compile import make_backend
from compiler.validate import _float64_copy, relative_errors


class RelativeBuckets(nn.Module):
    """T5's relative position buckets: a tensor made from constants (``arange``), then
    updated with ``+=``, indexes an embedding."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Embedding(8, 4)

    def forward(self, x):
        positions = torch.arange(x.shape[1])
        buckets = 0 + positions
        buckets += positions
        return x + self.bias(buckets % 8)


def test_augmented_assignment_through_the_inductor_hand_off():
    """The graph dynamo hands a backend before aot_autograd keeps ``operator.iadd``:
    ``buckets += positions``, folded to constants, must not become an in-place add on the
    module's constant (each call would add to it again, until the index is out of range)."""
    model, x = RelativeBuckets().eval(), torch.randn(2, 6, 4)
    backend = make_backend(validate="raise", codegen="inductor", iter_limit=4)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
    assert not any(r.fell_back for r in backend.reports)
    torch._dynamo.reset()


def test_float64_reference_converts_tied_weights_once_and_keeps_them_tied():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    wide = _float64_copy(model)
    assert wide[0].weight.dtype == torch.float64
    assert wide[0].weight is wide[1].weight
    assert model[0].weight.dtype == torch.float32  # the source is left as it was
    torch.testing.assert_close(wide[0].weight, model[0].weight.double())


def test_relative_errors_judge_infinities_and_each_element_at_its_scale():
    ref = torch.tensor([1e-9, 1.0, float("inf")], dtype=torch.float64)
    assert relative_errors(torch.tensor([2e-9, 1.0, float("inf")]), ref)[0] > 0.99
    assert relative_errors(torch.tensor([1e-9, 1.0, 3.0]), ref) == (float("inf"),) * 2
    finite = torch.tensor([1e-9, 1.0], dtype=torch.float64)
    assert relative_errors(torch.tensor([1e-9, float("nan")]), finite) == (float("inf"),) * 2
