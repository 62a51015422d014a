"""The analysis of e-graphs built from FX: shape, dtype and folded scalar values per class.

Each class carries a :class:`Meta`. Shapes come from the example inputs (fake tensors, no
real compute) and are propagated through every canonical op by running its torch
implementation on meta tensors, so a rule's right side gets its shape checked without any
per-op shape code. Merging two classes whose shapes or dtypes differ is an unsound rule and
raises :class:`~egraph.egraph.UnsoundMerge`. Scalar arithmetic on known values (``x.size(-1)
** 0.5``) folds to a literal.

>>> import torch
>>> m = Meta.of(torch.empty(2, 3))
>>> m.shape, m.dtype
((2, 3), torch.float32)
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from egraph.analysis import Analysis
from egraph.egraph import UnsoundMerge
from egraph.term import is_literal_op, literal
from frontends.fx.vocabulary import SPECS

if TYPE_CHECKING:
    from egraph.egraph import EGraph


class Meta(NamedTuple):
    """What is known of a class: ``kind`` is tensor, literal, scalar, tuple or unknown."""

    kind: str
    shape: tuple | None = None
    dtype: Any = None
    value: Any = None

    @classmethod
    def of(cls, value: Any) -> Meta:
        """The meta of a concrete, fake or meta tensor, a tuple of them, or a scalar."""
        if isinstance(value, torch.Tensor):
            try:
                shape = tuple(int(s) for s in value.shape)
            except (TypeError, ValueError):
                shape = None  # symbolic sizes
            return cls("tensor", shape, value.dtype)
        if isinstance(value, (tuple, list)):
            return cls("tuple", value=tuple(cls.of(v) for v in value))
        if isinstance(value, (bool, int, float)):
            return cls("scalar", value=value)
        return cls("unknown")

    def example(self) -> Any:
        """A meta tensor (or the value) standing for this class in shape inference."""
        if self.kind == "tensor":
            if self.shape is None or self.dtype is None:
                raise _Unknown
            return torch.empty(self.shape, dtype=self.dtype, device="meta")
        if self.kind in ("literal", "scalar"):
            if self.value is None and self.kind == "scalar":
                raise _Unknown
            return self.value
        raise _Unknown


def literal_value(op: tuple) -> Any:
    """The Python value of a typed literal operator (dtypes become torch dtypes)."""
    tag, value = op
    if tag == "dtype":
        return getattr(torch, value)
    if tag == "ellipsis":
        return Ellipsis
    return value


class _Unknown(Exception):
    """Shape inference cannot run: some input's shape is not known."""


UNKNOWN = Meta("unknown")

_SCALAR_OPS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "pow": operator.pow, "neg": operator.neg, "eq": operator.eq, "ne": operator.ne,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "sqrt": math.sqrt, "exp": math.exp, "log": math.log, "tanh": math.tanh, "sin": math.sin,
    "cos": math.cos, "floor": math.floor, "ceil": math.ceil, "abs": abs,
}


class TensorAnalysis(Analysis):
    """Shape/dtype/value analysis over the canonical vocabulary.

    ``leaves`` maps the name of each input, parameter, constant and opaque call to its meta.
    """

    def __init__(self, leaves: dict[str, Meta] | None = None):
        self.leaves: dict[str, Meta] = dict(leaves or {})

    def make(self, egraph: EGraph, node: tuple) -> Meta:
        op = node[0]
        if len(node) == 1:
            if is_literal_op(op):
                return Meta("literal", value=literal_value(op))
            return UNKNOWN
        data = egraph._data
        find = egraph._uf.find
        kids = [data[find(c)] or UNKNOWN for c in node[1:]]
        if op in ("tuple", "slice"):
            if all(k.kind in ("literal", "scalar") and (k.value is not None or k.kind ==
                                                         "literal") for k in kids):
                values = [k.value for k in kids]
                return Meta("literal", value=tuple(values) if op == "tuple" else slice(*values))
            return UNKNOWN
        if op in ("input", "param", "const"):
            return self.leaves.get(f"{op}:{kids[0].value}", UNKNOWN)
        if op == "opaque":
            return self.leaves.get(f"opaque:{kids[0].value}", UNKNOWN)
        if op == "getitem" and kids[0].kind == "tuple" and isinstance(kids[1].value, int):
            items = kids[0].value
            index = kids[1].value
            return items[index] if -len(items) <= index < len(items) else UNKNOWN
        if all(k.kind in ("literal", "scalar") for k in kids):
            fn = _SCALAR_OPS.get(op)
            values = [k.value for k in kids]
            if fn is not None and all(isinstance(v, (int, float)) for v in values):
                try:
                    return Meta("scalar", value=fn(*values))
                except (ArithmeticError, ValueError, TypeError):
                    return UNKNOWN
        spec = SPECS.get(op)
        if spec is None:
            return UNKNOWN
        try:
            args = [k.example() for k in kids]
            result = spec.run(args)
        except _Unknown:
            return UNKNOWN
        except Exception:  # an op meta tensors cannot run: shape stays unknown
            return UNKNOWN
        return Meta.of(result)

    def merge(self, a: Meta | None, b: Meta | None) -> Meta | None:
        if a is None or a.kind == "unknown":
            return b if b is not None and b.kind != "unknown" else a
        if b is None or b.kind == "unknown":
            return a
        if a.kind == "tensor" and b.kind == "tensor":
            if a.shape is not None and b.shape is not None and a.shape != b.shape:
                raise UnsoundMerge(f"merging a tensor of shape {a.shape} with one of {b.shape}")
            if a.dtype is not None and b.dtype is not None and a.dtype != b.dtype:
                raise UnsoundMerge(f"merging a {a.dtype} tensor with a {b.dtype} tensor")
            if a.shape is None and b.shape is not None:
                return b
            return a
        if a.kind in ("literal", "scalar") and b.kind in ("literal", "scalar"):
            if a.value is not None and b.value is not None and a.value != b.value:
                raise UnsoundMerge(f"merging the value {a.value!r} with {b.value!r}")
            return a if a.value is not None else b
        if {a.kind, b.kind} & {"literal", "scalar"} and {a.kind, b.kind} & {"tensor"}:
            raise UnsoundMerge(f"merging a {a.kind} with a {b.kind}")
        return a

    def modify(self, egraph: EGraph, cid: int) -> None:
        meta = egraph.data(cid)
        if meta is None or meta.kind != "scalar" or meta.value is None:
            return
        value = meta.value
        if isinstance(value, bool) or isinstance(value, (int, float)):
            leaf = egraph.add_node(literal(value))
            egraph._union(cid, leaf, "constant-fold")
