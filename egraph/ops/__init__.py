"""The canonical tensor vocabulary: the op table and a term constructor for each op.

Every operation of a tensor program has one canonical name, whatever spelling the user
wrote (``x + y``, ``torch.add``, ``aten.add.Tensor`` are all ``add``). The op table
(:mod:`egraph.ops.table`) declares each op once, with its parameters, spellings, kind,
costs and analyses; this package builds pattern terms over those names for rules written
in Python:

>>> from egraph import vars
>>> from egraph.ops import exp, log, softmax
>>> x, d = vars("x d")
>>> str(log(exp(x)))
'(log (exp ?x))'
>>> str(softmax(x, d))
'(softmax ?x ?d)'

Python scalars become typed literals (``mul(x, 2.0)`` is ``(mul ?x #float:2.0)``). A name
that is not in the table is an error that names the nearest op, so a misspelled op in a
rule fails when the rule is made:

>>> from egraph.ops import layer_nrom
Traceback (most recent call last):
...
ImportError: cannot import name 'layer_nrom' from 'egraph.ops' ...
>>> import egraph.ops
>>> egraph.ops.layer_nrom
Traceback (most recent call last):
...
AttributeError: no op 'layer_nrom' in the op table; did you mean 'layer_norm'?
"""

from __future__ import annotations

import difflib

from egraph.ops.table import TABLE, OpDef
from egraph.term import Term, as_term

__all__ = ["TABLE", "Op", "OpDef", "lookup"]


class Op:
    """The term constructor of one op of the table: ``Op("exp")(x)`` is ``(exp x)``; the
    number of arguments is checked against the op's parameters.

    >>> Op("add")(1, 2.0)
    Term('(add #int:1 #float:2.0)')
    >>> Op("exp")(1, 2)
    Traceback (most recent call last):
    ...
    TypeError: exp takes 1 argument (x), got 2
    """

    __slots__ = ("name", "entry")

    def __init__(self, name: str):
        self.name = name
        self.entry = lookup(name)

    def __call__(self, *args) -> Term:
        params = self.entry.params
        variadic = bool(params) and params[-1].startswith("*")
        if len(args) != len(params) and not (variadic and len(args) >= len(params) - 1):
            plural = "" if len(params) == 1 else "s"
            raise TypeError(f"{self.name} takes {len(params)} argument{plural} "
                            f"({' '.join(params)}), got {len(args)}")
        return Term(self.name, tuple(as_term(a) for a in args))

    @property
    def commutative(self) -> bool:
        """True when the operand order does not matter (``add``, ``mul``, ...)."""
        return self.entry.commutative

    def __repr__(self) -> str:
        return f"Op({self.name!r})"


def lookup(name: str) -> OpDef:
    """The table entry of op ``name``; an unknown name raises AttributeError naming the
    nearest op.

    >>> lookup("softmax").kind
    'reduction'
    """
    entry = TABLE.get(name)
    if entry is None:
        near = difflib.get_close_matches(name, TABLE, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise AttributeError(f"no op {name!r} in the op table{hint}")
    return entry


def __getattr__(name: str) -> Op:
    # Tools probe modules for hooks (``pytest_plugins``, dunders): those are not ops.
    if name.startswith("_") or name.startswith("pytest"):
        raise AttributeError(name)
    return Op(name)
