"""Parameters bound into inference graphs: what is made of them alone is made once, and
is never stale: written in place, replaced, or another model's, the program follows."""

import torch
import torch.nn as nn

from compiler.bound import bind_parameters, parameter_positions
from compiler.compile import make_backend


def _convnet() -> nn.Module:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 4, 1)).eval()
    with torch.no_grad():
        model[1].running_mean.normal_()
        model[1].running_var.uniform_(0.5, 2.0)
    return model


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_batch_norm_folds_and_follows_its_parameters_written_in_place():
    torch.manual_seed(0)
    model, x = _convnet(), torch.randn(2, 3, 8, 8)
    backend = make_backend(validate="raise")
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        _close(compiled(x), model(x))
        used = backend.reports[-1].extraction.used
        assert used.get("conv-bn", 0) + used.get("conv-bn-onednn", 0) >= 1, used
        model[1].running_var.mul_(3)  # (eval statistics updated in place)
        model[0].weight.neg_()
        _close(compiled(x), model(x))


def test_a_replaced_parameter_and_another_models_parameters_are_read():
    torch.manual_seed(0)
    backend = make_backend(validate="raise")
    first, second, x = _convnet(), _convnet(), torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        for model in (first, second, first):
            _close(torch.compile(model, backend=backend)(x), model(x))
        compiled = torch.compile(first, backend=backend)
        compiled(x)
        first[0].weight = nn.Parameter(torch.randn_like(first[0].weight))
        _close(compiled(x), first(x))


class _Counting(nn.Module):
    """A buffer the forward writes into, beside a weight it only reads."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return x @ (self.weight * 2) + self.calls


def test_a_buffer_the_graph_writes_stays_an_input_and_is_written():
    torch.manual_seed(0)
    model, reference, x = _Counting(), _Counting(), torch.randn(3, 4)
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend=make_backend(validate="raise"))
    with torch.no_grad():
        for _ in range(3):
            _close(compiled(x), reference(x))
    assert model.calls.item() == reference.calls.item() == 3


def test_only_unwritten_parameters_are_bound_and_the_source_is_not_changed():
    def forward(x, w, calls):
        calls.add_(1)
        return x @ w.t()
    gm = torch.fx.symbolic_trace(forward)
    before = gm.code
    inputs = (torch.randn(2, 4), nn.Parameter(torch.randn(3, 4)),
              nn.Parameter(torch.zeros(()), requires_grad=False))
    assert parameter_positions(gm, inputs) == [1]
    bound, positions = bind_parameters(gm, inputs)
    assert positions == [1] and gm.code == before
    assert bound.bound_1 is inputs[1]
    _close(bound(inputs[0], inputs[2]), inputs[0] @ inputs[1].t())


def test_the_bound_program_runs_while_its_tensors_are_passed_and_the_unbound_one_after():
    from compiler.bound import Bound

    w, other = torch.ones(2), torch.full((2,), 5.0)
    bound_program = Bound(type("P", (), {"module": None, "__call__": lambda self, x: x + w})(),
                          [1], [w], lambda: torch.add)
    x = torch.zeros(2)
    assert bound_program(x, w).tolist() == [1.0, 1.0]
    assert bound_program(x, other).tolist() == [5.0, 5.0]  # another tensor: the unbound one


def test_a_graph_with_symbolic_sizes_binds_its_parameters_too():
    """Automatic dynamic shapes (a model compiled again at another batch) or
    ``dynamic=True``: the parameters are bound all the same, and every size is right."""
    torch.manual_seed(0)
    model = _convnet()
    backend = make_backend(validate="raise")
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for batch in (2, 5, 3):
            x = torch.randn(batch, 3, 8, 8)
            _close(compiled(x), model(x))
        model[1].running_mean.add_(1)
        _close(compiled(x), model(x))
    assert any(r.extraction.used.get("conv-bn", 0) + r.extraction.used.get("conv-bn-onednn", 0)
               for r in backend.reports)
