"""Term constructors for the canonical tensor vocabulary (torch-free).

Every operation of a tensor program has one canonical name, whatever spelling the user
wrote (``x + y``, ``torch.add``, ``aten.add.Tensor`` are all ``add``); the full table with
each op's parameters and torch implementation lives in ``frontends.fx.vocabulary``. This
module builds pattern terms over those names for rules written in Python:

>>> from egraph import vars
>>> from egraph.ops import exp, log, softmax
>>> x, d = vars("x d")
>>> str(log(exp(x)))
'(log (exp ?x))'
>>> str(softmax(x, d))
'(softmax ?x ?d)'

Any canonical name is available (``from egraph.ops import layer_norm``); Python scalars
become typed literals (``mul(x, 2.0)`` is ``(mul ?x #float:2.0)``).
"""

from __future__ import annotations

from egraph.term import Term, as_term


class Op:
    """A constructor for terms ``(name arg ...)``."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args) -> Term:
        return Term(self.name, tuple(as_term(a) for a in args))

    def __repr__(self) -> str:
        return f"Op({self.name!r})"


def __getattr__(name: str) -> Op:
    # Tools probe modules for hooks (``pytest_plugins``, dunders): those are not ops.
    if name.startswith("_") or name.startswith("pytest"):
        raise AttributeError(name)
    return Op(name)
