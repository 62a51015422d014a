"""``einsum`` equations: read (spaces, the implicit output, an ellipsis written as letters
from the operands' ranks) and planned as the ops they are made of, for the ``einsum``
op's cost and for the rules that lower it (``einsum-product``, ``einsum-sum``). Pure
Python: an expression is ``(op, [arguments])``, an argument an operand (whatever the
caller passed), a Python value or a nested expression.

>>> plan("b h i d, b h j d -> b h i j", ("q", "k"), ((2, 3, 4, 8), (2, 3, 5, 8)))
('matmul', ['q', ('permute', ['k', (0, 1, 3, 2)])])
>>> plan("i,j->ij", ("t", "f"), ((4,), (5,)))
('mul', [('unsqueeze', ['t', 1]), ('unsqueeze', ['f', 0])])
>>> flops("bhid,bhjd->bhij", ((2, 3, 4, 8), (2, 3, 5, 8)))
1920.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["flops", "plan", "read", "summed_count"]

_SPARE = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def read(equation: Any, ranks: Sequence[int | None]) -> tuple[list[str], str] | None:
    """The operands' terms and the output of ``equation``, spaces removed, the implicit
    output written out (the letters met once, in alphabetical order; after an ellipsis's)
    and an ellipsis written as letters from the operands' ``ranks``, right-aligned as
    einsum broadcasts them. None where the equation is not a string of as many terms as
    ``ranks``, a rank is unknown where an ellipsis needs it, or the output drops the
    ellipsis (a sum over dims einsum would broadcast first).

    >>> read("... i d, ... j d -> ... i j", (4, 4))
    (['ABid', 'ABjd'], 'ABij')
    >>> read("..., f", (1, 1))
    (['A', 'f'], 'Af')
    """
    if not isinstance(equation, str):
        return None
    spec = equation.replace(" ", "")
    inputs, arrow, out = spec.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(ranks):
        return None
    if "..." in spec:
        if (arrow and "..." not in out) or any(
                r is None for t, r in zip(terms, ranks) if "..." in t):
            return None
        covered = [r - len(t.replace("...", "")) if "..." in t else 0
                   for t, r in zip(terms, ranks)]
        free = [c for c in _SPARE if c not in spec]
        widest = max(covered)
        if min(covered) < 0 or widest > len(free):
            return None
        letters = "".join(free[:widest])
        terms = [t.replace("...", letters[widest - n:]) for t, n in zip(terms, covered)]
        if arrow:
            out = out.replace("...", letters)
        else:
            met = "".join(terms).replace(letters, "")
            out = letters + "".join(sorted(c for c in set(met) if met.count(c) == 1))
    elif not arrow:
        letters = "".join(terms)
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if "." in "".join(terms) + out:
        return None
    return terms, out


def _sizes(terms: list[str], shapes: Sequence[tuple | None]) -> list[dict] | None:
    """Each operand's size per letter, where every shape is known, as ints, and of its
    term's rank."""
    sizes = []
    for term, shape in zip(terms, shapes):
        if shape is None or len(shape) != len(term) or not all(type(n) is int for n in shape):
            return None
        sizes.append(dict(zip(term, shape)))
    return sizes


def _letters(equation: Any, shapes: Sequence[tuple | None]
             ) -> tuple[list[str], str, dict[str, int]] | None:
    """The terms, the output and each letter's size (the largest an operand gives it: a
    size of 1 broadcasts), or None where the shapes are not known ints."""
    parsed = read(equation, [None if s is None else len(s) for s in shapes])
    sizes = None if parsed is None else _sizes(parsed[0], shapes)
    if sizes is None:
        return None
    terms, out = parsed
    return terms, out, {c: max(s.get(c, 1) for s in sizes) for c in set("".join(terms))}


def summed_count(equation: Any, shapes: Sequence[tuple | None]) -> int | None:
    """How many products each output element sums (the sizes of the letters no output
    dim keeps, multiplied), or None where the shapes are not known ints.

    >>> summed_count("bij,bjk->bik", ((2, 3, 4), (2, 4, 5)))
    4
    """
    found = _letters(equation, shapes)
    if found is None:
        return None
    _, out, sizes = found
    return math.prod(n for c, n in sizes.items() if c not in out)


def flops(equation: Any, shapes: Sequence[tuple | None]) -> float:
    """Multiplications and additions: one of each per product summed (every letter's
    size multiplied), one per product where a single operand is summed or nothing is; 0
    where the shapes are unknown."""
    found = _letters(equation, shapes)
    if found is None:
        return 0.0
    terms, out, sizes = found
    products = math.prod(sizes.values())
    return 2.0 * products if len(terms) > 1 and set(sizes) - set(out) else float(products)


def plan(equation: Any, operands: Sequence[Any], shapes: Sequence[tuple | None]) -> Any:
    """``einsum(equation, *operands)`` as the ops it is made of, so that the rules see
    them: one operand permuted and summed; two as a (batched) ``matmul`` between
    permutes, or a broadcast ``mul`` where nothing is contracted (an outer product).
    Where an operand has several free or contracted letters, they are flattened into one
    dim by a reshape (einsum's own plan), which needs the ``shapes`` as ints. None for
    equations it does not plan: a repeated letter (a diagonal), three operands, sizes
    unknown where letters are flattened.

    >>> plan("ibhd,jhd->ijbh", ("q", "p"), ((5, 2, 4, 8), (7, 4, 8)))[0]
    'permute'
    """
    parsed = read(equation, [None if s is None else len(s) for s in shapes])
    if parsed is None or len(operands) not in (1, 2):
        return None
    terms, out = parsed
    if any(len(set(t)) != len(t) for t in [*terms, out]) or set(out) - set("".join(terms)):
        return None
    summed = [_summed_out(x, t, out + "".join(terms[:i] + terms[i + 1:]))
              for i, (x, t) in enumerate(zip(operands, terms))]
    if len(operands) == 1:
        x, term = summed[0]
        return _ordered(x, term, out)
    (a, ta), (b, tb) = summed
    batch = [c for c in ta if c in tb and c in out]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    inner = [c for c in ta if c in tb and c not in out]
    # One operand's free letters ahead of every shared one are batch dims that the other
    # operand broadcasts over ("bnd,de->bne", "ABij,Bjk->ABik" from an ellipsis), where
    # the other has no batch dims of its own: torch.matmul folds them into the rows then.
    # Otherwise they are flattened into the rows ("ibhd,jhd->ijbh", Transformer-XL's
    # relative scores: one matmul per head, not one per (i, h) of two rows each).
    lead_a = _leading(left, ta, batch)
    lead_b = [] if lead_a else _leading(right, tb, batch)
    if (len(left) - len(lead_a) > 1 or len(right) - len(lead_b) > 1 or len(inner) > 1
            or (lead_a or lead_b) and batch):
        sizes = _sizes(terms, shapes)
        if sizes is None or any(sizes[0][c] != sizes[1][c] for c in inner):
            return None
        return _flattened_product(a, ta, b, tb, out, batch, left, right, inner, sizes)
    left, right = left[len(lead_a):], right[len(lead_b):]
    # a as (lead, batch, left, inner), b as (lead, batch, inner, right); a missing letter
    # is a dim of 1
    a = _arranged(a, ta, lead_a + batch, [left, inner])
    b = _arranged(b, tb, lead_b + batch, [inner, right])
    lead = lead_a + lead_b
    # (nothing contracted: an outer or elementwise product, (.., l, 1) * (.., 1, r))
    product = ("matmul" if inner else "mul", [a, b])
    rank = len(batch) + len(lead) + 2
    term = "".join(lead + batch) + (left[0] if left else "_") + (right[0] if right else "^")
    for dim, kept in ((rank - 1, right), (rank - 2, left)):
        if not kept:
            product = ("squeeze", [product, dim])
    return _ordered(product, term.replace("_", "").replace("^", ""), out)


def _flattened_product(a, ta: str, b, tb: str, out: str, batch: list[str], left: list[str],
                       right: list[str], inner: list[str], sizes: list[dict]):
    """``a`` and ``b`` as (batch..., rows, inner) and (batch..., inner, columns), each
    group of letters flattened into one dim, multiplied, and the rows and columns split
    back into their letters (a batch dim of 1 broadcasts, as in einsum). The operand
    whose letter ends the output gives the columns, so that the result's last dim is the
    product's own last: capsule routing's 'ijnm,bin->bijm' made (i, j m, b) and left a
    result whose every later use copied it (1.17 times eager's time, against 0.98)."""
    if out[-1:] and out[-1] in left:
        return _flattened_product(b, tb, a, ta, out, batch, right, left, inner, sizes[::-1])

    def flat(x, term: str, own: dict, groups: list[list[str]]):
        x = _arranged(x, term, batch, groups)
        shape = (*(own[c] for c in batch), *(math.prod(own[c] for c in g) for g in groups))
        return ("reshape", [x, shape])
    rows, columns = [c for c in ta if c in left], [c for c in tb if c in right]
    product = ("matmul" if inner else "mul", [
        flat(a, ta, sizes[0], [rows, inner] if inner else [rows, []]),
        flat(b, tb, sizes[1], [inner, columns] if inner else [[], columns])])
    whole = (*(max(sizes[0][c], sizes[1][c]) for c in batch), *(sizes[0][c] for c in rows),
             *(sizes[1][c] for c in columns))
    letters = batch + rows + columns
    return _ordered(("reshape", [product, whole]), "".join(letters), out)


def _leading(free: list[str], term: str, batch: list[str]) -> list[str]:
    """All but the last of an operand's ``free`` letters, where they all come before its
    ``batch`` letters in ``term`` (so they lead its dims); else none."""
    first_batch = min((term.index(c) for c in batch), default=len(term))
    lead = free[:-1]
    return lead if all(term.index(c) < first_batch for c in lead) else []


def _summed_out(x, term: str, kept: str) -> tuple[Any, str]:
    """Sum away the letters of ``term`` that ``kept`` (the output's and the other
    operands') does not hold."""
    gone = tuple(i for i, c in enumerate(term) if c not in kept)
    if not gone:
        return x, term
    return ("sum", [x, gone, False]), "".join(c for c in term if c in kept)


def _arranged(x, term: str, batch: list[str], last: list[list[str]]):
    """``x`` permuted to (batch..., *last), with a dim of 1 for each empty group."""
    perm = tuple(term.index(c) for c in batch + [c for g in last for c in g])
    if perm != tuple(range(len(term))):
        x = ("permute", [x, perm])
    for position, group in enumerate(last):
        if not group:
            x = ("unsqueeze", [x, len(batch) + position])
    return x


def _ordered(x, term: str, out: str):
    """``x``, whose dims are the letters of ``term``, permuted to the output's order."""
    perm = tuple(term.index(c) for c in out)
    return x if perm == tuple(range(len(term))) else ("permute", [x, perm])
