"""The naive formulas of the stability experiments, each with its exact reference.

Every formula is written as users write it (the torch function), has a reference evaluated
with mpmath at 60 digits from the same mathematics, a natural input domain where the naive
form misbehaves, and the input domains a user would declare (positivity).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import mpmath as mp
import torch

mp.mp.dps = 60


@dataclass
class Formula:
    """A naive formula: ``fn`` (torch), ``exact`` (mpmath over nested lists of floats),
    ``sample(generator)`` its inputs, ``domains`` declared facts, ``dtype``."""

    name: str
    fn: Callable
    exact: Callable
    sample: Callable
    domains: dict[str, str] = field(default_factory=dict)
    dtype: torch.dtype = torch.float32


def _elementwise(f):
    """An mpmath reference applied element by element (same shapes for all inputs)."""
    def exact(*tensors):
        flat = [t.double().flatten().tolist() for t in tensors]
        out = [float(f(*[mp.mpf(v) for v in vals])) for vals in zip(*flat)]
        return torch.tensor(out, dtype=torch.float64).reshape(tensors[0].shape)
    return exact


def _rows(f):
    """An mpmath reference applied row by row (last dim), returning a row or a scalar."""
    def exact(*tensors):
        rows = [t.double().reshape(-1, t.shape[-1]).tolist() for t in tensors]
        out = [f(*[[mp.mpf(v) for v in row] for row in group]) for group in zip(*rows)]
        if isinstance(out[0], list):
            return torch.tensor([[float(v) for v in r] for r in out],
                                dtype=torch.float64).reshape(tensors[0].shape)
        return torch.tensor([float(v) for v in out], dtype=torch.float64).reshape(
            tensors[0].shape[:-1])
    return exact


def _softmax(row):
    e = [mp.exp(v) for v in row]
    s = mp.fsum(e)
    return [v / s for v in e]


def _uniform(gen, shape, lo, hi, dtype=torch.float32):
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def _log_uniform(gen, shape, lo_exp, hi_exp, signed=False):
    mag = 10 ** _uniform(gen, shape, lo_exp, hi_exp, torch.float64)
    if signed:
        mag = mag * torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0)
    return mag.float()


def _close_pair(gen, shape, base_lo, base_hi, rel):
    a = 10 ** _uniform(gen, shape, base_lo, base_hi, torch.float64)
    b = a * (1 + _uniform(gen, shape, -rel, rel, torch.float64))
    return a.float(), b.float()


ROW = (16, 32)
VEC = (512,)

FORMULAS: list[Formula] = [
    Formula("softmax", lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True),
            _rows(_softmax), lambda g: (_uniform(g, ROW, -100, 100),)),
    Formula("logsumexp", lambda x: torch.log(torch.exp(x).sum(-1)),
            _rows(lambda r: mp.log(mp.fsum(mp.exp(v) for v in r))),
            lambda g: (_uniform(g, ROW, -100, 100),)),
    Formula("log-softmax", lambda x: torch.log(torch.softmax(x, -1)),
            _rows(lambda r: [mp.log(v) for v in _softmax(r)]),
            lambda g: (_uniform(g, ROW, -60, 60),)),
    Formula("cross-entropy-from-probabilities",
            lambda x, y: -torch.log(torch.softmax(x, -1).gather(-1, y)),
            lambda x, y: torch.tensor([[float(-mp.log(_softmax([mp.mpf(v) for v in row])[i[0]]))]
                                       for row, i in zip(x.double().tolist(), y.tolist())],
                                      dtype=torch.float64),
            lambda g: (_uniform(g, ROW, -60, 60), torch.randint(0, ROW[1], (ROW[0], 1),
                                                                generator=g))),
    Formula("variance-one-pass", lambda x: (x * x).mean(-1) - x.mean(-1) * x.mean(-1),
            _rows(lambda r: mp.fsum((v - mp.fsum(r) / len(r)) ** 2 for v in r) / len(r)),
            lambda g: (_uniform(g, ROW, 1000, 1001),)),
    Formula("layernorm-one-pass",
            lambda x: (x - x.mean(-1, keepdim=True)) / torch.sqrt(
                (x * x).mean(-1, keepdim=True) - x.mean(-1, keepdim=True) ** 2 + 1e-5),
            _rows(lambda r: [(v - mp.fsum(r) / len(r)) / mp.sqrt(
                mp.fsum((w - mp.fsum(r) / len(r)) ** 2 for w in r) / len(r) + mp.mpf("1e-5"))
                for v in r]),
            lambda g: (_uniform(g, ROW, 300, 301),)),
    Formula("sigmoid-fp16", lambda x: 1 / (1 + torch.exp(-x)),
            _elementwise(lambda v: 1 / (1 + mp.exp(-v))),
            lambda g: (_uniform(g, VEC, -16, 0).half(),), dtype=torch.float16),
    Formula("log-sigmoid", lambda x: torch.log(torch.sigmoid(x)),
            _elementwise(lambda v: -mp.log(1 + mp.exp(-v))),
            lambda g: (_uniform(g, VEC, -100, 100),)),
    Formula("softplus", lambda x: torch.log(1 + torch.exp(x)),
            _elementwise(lambda v: mp.log(1 + mp.exp(v))),
            lambda g: (_uniform(g, VEC, -100, 100),)),
    Formula("log1p", lambda x: torch.log(1 + x), _elementwise(lambda v: mp.log(1 + v)),
            lambda g: (_log_uniform(g, VEC, -10, -2),)),
    Formula("expm1", lambda x: torch.exp(x) - 1, _elementwise(lambda v: mp.exp(v) - 1),
            lambda g: (_log_uniform(g, VEC, -10, -2, signed=True),)),
    Formula("log1mexp", lambda x: torch.log(1 - torch.exp(-x)),
            _elementwise(lambda v: mp.log(1 - mp.exp(-v))),
            lambda g: (_log_uniform(g, VEC, -8, 1),), {"x": "positive"}),
    Formula("vector-norm", lambda x: torch.sqrt((x * x).sum(-1)),
            _rows(lambda r: mp.sqrt(mp.fsum(v * v for v in r))),
            lambda g: (torch.randn(ROW, generator=g) * 1e25,)),
    Formula("sqrt-difference", lambda a, b: torch.sqrt(a) - torch.sqrt(b),
            _elementwise(lambda a, b: mp.sqrt(a) - mp.sqrt(b)),
            lambda g: _close_pair(g, VEC, 4, 6, 1e-4), {"a": "positive", "b": "positive"}),
    Formula("reciprocal-difference", lambda a, b: 1 / a - 1 / b,
            _elementwise(lambda a, b: 1 / a - 1 / b),
            lambda g: _close_pair(g, VEC, 2, 4, 1e-4), {"a": "positive", "b": "positive"}),
    Formula("log-difference", lambda a, b: torch.log(a) - torch.log(b),
            _elementwise(lambda a, b: mp.log(a) - mp.log(b)),
            lambda g: _close_pair(g, VEC, 4, 6, 1e-4), {"a": "positive", "b": "positive"}),
    Formula("cos-difference", lambda a, b: torch.cos(a) - torch.cos(b),
            _elementwise(lambda a, b: mp.cos(a) - mp.cos(b)),
            lambda g: _close_pair(g, VEC, -1, 0.5, 1e-4)),
    Formula("tanh-from-exp", lambda x: (torch.exp(x) - torch.exp(-x)) /
            (torch.exp(x) + torch.exp(-x)), _elementwise(mp.tanh),
            lambda g: (_uniform(g, VEC, -100, 100),)),
    Formula("logaddexp", lambda a, b: torch.log(torch.exp(a) + torch.exp(b)),
            _elementwise(lambda a, b: mp.log(mp.exp(a) + mp.exp(b))),
            lambda g: (_uniform(g, VEC, -100, 100), _uniform(g, VEC, -100, 100))),
    Formula("hypot", lambda a, b: torch.sqrt(a * a + b * b),
            _elementwise(lambda a, b: mp.sqrt(a * a + b * b)),
            lambda g: (torch.randn(VEC, generator=g) * 1e25, torch.randn(VEC, generator=g) * 1e25)),
    Formula("log-square", lambda x: torch.log(x * x), _elementwise(lambda v: mp.log(v * v)),
            lambda g: (_log_uniform(g, VEC, 20, 30, signed=True),), {"x": "nonzero"}),
    Formula("one-minus-sigmoid", lambda x: 1 - torch.sigmoid(x),
            _elementwise(lambda v: 1 - 1 / (1 + mp.exp(-v))), lambda g: (_uniform(g, VEC, 5, 30),)),
    Formula("log-one-minus-sigmoid", lambda x: torch.log(1 - torch.sigmoid(x)),
            _elementwise(lambda v: mp.log(1 - 1 / (1 + mp.exp(-v)))),
            lambda g: (_uniform(g, VEC, 5, 60),)),
    Formula("attention-fp16",
            lambda q, k, v: (torch.exp(q @ k.transpose(-2, -1) / 4.0) /
                             torch.exp(q @ k.transpose(-2, -1) / 4.0).sum(-1, keepdim=True)) @ v,
            lambda q, k, v: _attention_exact(q, k, v),
            lambda g: tuple((torch.randn((2, 16, 16), generator=g) * s).half()
                            for s in (6.0, 6.0, 1.0)), dtype=torch.float16),
]


def _attention_exact(q, k, v):
    out = []
    for qb, kb, vb in zip(q.double().tolist(), k.double().tolist(), v.double().tolist()):
        rows = []
        for qi in qb:
            scores = [mp.fsum(mp.mpf(a) * mp.mpf(b) for a, b in zip(qi, kj)) / 4 for kj in kb]
            w = _softmax(scores)
            rows.append([float(mp.fsum(wi * mp.mpf(vj[d]) for wi, vj in zip(w, vb)))
                         for d in range(len(vb[0]))])
        out.append(rows)
    return torch.tensor(out, dtype=torch.float64)

