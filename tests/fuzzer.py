# ruff: noqa: UP031 - op templates are %-formatted: their {v} fields are filled later
"""A fuzzer for the whole pipeline: random PyTorch programs, judged against float64.

The generator writes programs the way users write them (Python source of a function or an
``nn.Module``, traced with ``torch.fx.symbolic_trace``): pointwise math, Python float
constants of every magnitude (1e-12 ... 1e12, values not exact in binary such as 0.1 and
1/3, chains such as ``(x * 1e-5 + 1) * 1e5``), reductions and the softmax family,
broadcasting, matmul and ``nn.Linear``, views and reshapes (``x.view(x.size(0), -1)``,
``B, T, C = x.shape``), indexing, gather, embeddings, integer arithmetic, comparisons and
casts, in float32 and float16 (some float16 programs on purpose past the overflow
threshold) or bfloat16. Every choice goes through a :class:`Chooser`, so the same generator
runs from a seeded ``random.Random`` (:func:`program`: program ``i`` of seed ``s`` is
reproducible) or from a hypothesis draw (:func:`programs`: failures shrink to small
programs).

:func:`check` sends one program through the pipeline (``EGraph.from_fx`` -> ``saturate``
-> ``extract`` under every cost model, strict validation; optionally ``torch.compile`` with
the ``egraph`` backend, ``torch.export`` with a dynamic batch, or training steps through
``torch.compile`` at three batch sizes, whose gradients are judged too) and judges each
result on *fresh* inputs (new seeds, and a second batch size) against the source evaluated
in float64. The judge is elementwise and relative, ``|got - ref| <= tol * max(|ref|, tiny)``
(``tiny``: the dtype's smallest normal), and only as generous as the source itself: an
element is wrong when the result's error breaks the contract validation promises
(normwise within twice the source's, each element within ``ELEMENTWISE_SLACK`` times the
source's worst, plus 64 roundings), where the source's error ``err_src`` is the worst error
of the source in its own dtype, run as written and in a few Monte Carlo runs that move
each inexact op's result by up to an ulp (samples of the source's own rounding errors: an
element that cancels in the source is as uncertain there as the source makes it), or when
the result is not finite where the source and the reference are. Integer and boolean
outputs match exactly (or match one of those runs of the source, for comparisons of
floats).

>>> p = program(seed=0, index=3)
>>> p.source == program(seed=0, index=3).source
True
>>> "def " in p.source
True
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import linecache
import math
import random
import re
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn as nn

from compiler.validate import (
    ELEMENTWISE_SLACK,
    NORMWISE_SLACK,
    reference_spread,
    rounding_samples,
    sharing_pairs,
)

__all__ = [
    "CATEGORIES", "Chooser", "DrawChooser", "InputSpec", "Outcome", "Program", "RandomChooser",
    "Result", "check", "cost_models", "generate", "judge_callable", "program", "program_from",
    "programs", "shrink", "summarize",
]

CATEGORIES = ("ok", "fallback", "clear-refusal", "wrong", "crash", "invalid")
_SEVERITY = {"ok": 0, "clear-refusal": 1, "fallback": 2, "invalid": 3, "wrong": 4, "crash": 5}

# Saturation per program: small, so that each program takes well under a second. The
# iteration and node limits decide; the time limit is a safety net.
LIMITS = {"iter_limit": 4, "node_limit": 3000, "time_limit": 5.0}

# Phrases of the documented clear error an emitted module raises for an input size other
# than the one it was built for (the message also names that size).
_SIZE_REFUSAL = re.compile(r"built for|speciali[sz]ed (?:to|for)|compiled for|traced for|"
                           r"only (?:runs|supports|accepts)", re.IGNORECASE)


# -- choices ----------------------------------------------------------------------------


class Chooser:
    """Where the generator's choices come from. Options are listed simplest first, so a
    shrinker that lowers indices simplifies the program."""

    def int(self, lo: int, hi: int) -> int:  # inclusive bounds
        raise NotImplementedError

    def pick(self, options: Sequence) -> Any:
        return options[self.int(0, len(options) - 1)]

    def chance(self, p: float) -> bool:
        """True with probability about ``p`` (shrinks to False)."""
        return self.int(0, 999) >= 1000 - round(p * 1000)


class RandomChooser(Chooser):
    """Choices from a seeded ``random.Random``."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


class DrawChooser(Chooser):
    """Choices drawn by hypothesis (``draw`` of ``st.composite`` or ``data.draw``)."""

    def __init__(self, draw: Callable):
        from hypothesis import strategies as st

        self.draw = draw
        self.st = st

    def int(self, lo: int, hi: int) -> int:
        return self.draw(self.st.integers(lo, hi))


# -- programs ---------------------------------------------------------------------------


@dataclass
class InputSpec:
    """A graph input: symbolic shape (``"B"`` is the batch), kind (``f`` float, ``i``
    integer, ``b`` bool), and how its values are drawn."""

    name: str
    shape: tuple
    kind: str
    domain: str = "any"  # any | positive (declared to from_fx) | observed (positive samples)
    scale: float = 1.0
    lo: int = 0
    hi: int = 1


@dataclass
class ParamSpec:
    """A parameter or submodule: its ``__init__`` line and how its values are drawn."""

    name: str
    line: str
    scale: float = 1.0
    positive: bool = False


@dataclass
class Stmt:
    """One statement of ``forward``: its text, the names it defines and uses."""

    text: str
    defs: tuple[str, ...]
    uses: tuple[str, ...]


@dataclass
class Program:
    """A generated program: printable source, inputs, parameters, and the sizes it uses."""

    seed: Any
    index: int
    dtype: str
    batch: int
    batch2: int
    inputs: list[InputSpec]
    params: list[ParamSpec]
    stmts: list[Stmt]
    outputs: list[str]
    overflow: bool = False

    @property
    def label(self) -> str:
        return f"seed={self.seed} program={self.index}"

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def domains(self) -> dict[str, str]:
        return {s.name: "positive" for s in self.inputs if s.domain == "positive"}

    @property
    def source(self) -> str:
        args = ", ".join(s.name for s in self.inputs)
        body = [line for st in self.stmts for line in st.text.split("\n")]
        ret = self.outputs[0] if len(self.outputs) == 1 else "(" + ", ".join(self.outputs) + ")"
        body.append(f"return {ret}")
        head = ["import math", "import torch", "import torch.nn as nn",
                "import torch.nn.functional as F", "", ""]
        if self.params:
            lines = head + ["class Program(nn.Module):", "    def __init__(self):",
                            "        super().__init__()"]
            lines += ["        " + p.line for p in self.params]
            lines += ["", f"    def forward(self, {args}):"]
            lines += ["        " + b for b in body]
        else:
            lines = head + [f"def program({args}):"] + ["    " + b for b in body]
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        """The source with the inputs it runs on, as a comment block (for reports)."""
        ins = []
        for s in self.inputs:
            shape = tuple(self.batch if d == "B" else _size(d, self.batch) for d in s.shape)
            if s.kind == "f":
                what = f"{self.dtype} randn * {s.scale:g}"
                if s.domain != "any":
                    what = f"{self.dtype} uniform(0.1, 1) * {s.scale:g} ({s.domain})"
            elif s.kind == "i":
                what = f"int64 in [{s.lo}, {s.hi}]"
            else:
                what = "bool"
            ins.append(f"#   {s.name}: {shape} {what}")
        header = [f"# {self.label}  dtype={self.dtype} batch={self.batch} "
                  f"(second batch {self.batch2})", "# inputs:"] + ins
        if self.params:
            header.append("# parameters: randn * scale, seeded per name (fuzzer.init_params)")
        return "\n".join(header) + "\n" + self.source

    # -- running ------------------------------------------------------------------------

    def build(self) -> nn.Module | Callable:
        """A fresh instance of the program (module with its seeded parameters, or the
        function), in the program's dtype."""
        filename = f"<fuzz {self.seed}:{self.index}:{_digest(self.source)[:8]}>"
        src = self.source
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        namespace: dict[str, Any] = {"__name__": "fuzz_program"}
        exec(compile(src, filename, "exec"), namespace)  # noqa: S102 - our own generated code
        if not self.params:
            return namespace["program"]
        module = namespace["Program"]()
        init_params(self, module)
        return module.to(self.torch_dtype)

    def make_inputs(self, tag: str, batch: int | None = None) -> tuple:
        """Inputs for ``tag`` (each input from its own seeded generator, so slicing a
        program keeps the values of the inputs it keeps). ``tag`` ``"mixed"`` draws
        inputs that were only observed positive with both signs."""
        batch = self.batch if batch is None else batch
        out = []
        for s in self.inputs:
            gen = torch.Generator().manual_seed(_seed(self.seed, self.index, tag, s.name))
            shape = tuple(_size(d, batch) for d in s.shape)
            if s.kind == "f":
                if s.domain == "any" or (s.domain == "observed" and tag == "mixed"):
                    x = torch.randn(shape, generator=gen, dtype=torch.float64) * s.scale
                else:
                    x = (torch.rand(shape, generator=gen, dtype=torch.float64) * 0.9 + 0.1)
                    x = x * s.scale
                out.append(x.to(self.torch_dtype))
            elif s.kind == "i":
                out.append(torch.randint(s.lo, s.hi + 1, shape, generator=gen))
            else:
                out.append(torch.randint(0, 2, shape, generator=gen).bool())
        return tuple(out)

    def sliced(self, outputs: list[str]) -> Program:
        """The program cut down to what ``outputs`` need (a shrinking step)."""
        need = set(outputs)
        keep = []
        for st in reversed(self.stmts):
            if need & set(st.defs):
                keep.append(st)
                need |= set(st.uses)
        keep.reverse()
        return replace(self, stmts=keep, outputs=list(outputs),
                       inputs=[s for s in self.inputs if s.name in need],
                       params=[p for p in self.params if p.name in need])


def init_params(prog: Program, module: nn.Module) -> None:
    """Give each parameter seeded values (per name, so slicing keeps them)."""
    specs = {p.name: p for p in prog.params}
    with torch.no_grad():
        for name, p in module.named_parameters():
            spec = specs[name.split(".")[0]]
            gen = torch.Generator().manual_seed(_seed(prog.seed, prog.index, "param", name))
            if spec.positive:
                v = torch.rand(p.shape, generator=gen, dtype=torch.float64) + 0.5
            else:
                v = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_((v * spec.scale).to(p.dtype))


def _seed(*parts) -> int:
    return int(_digest(repr(parts))[:15], 16)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _size(d, batch: int) -> int:
    if isinstance(d, int):
        return d
    if d == "B":
        return batch
    return batch * int(d.split("*")[1])


# -- the generator ----------------------------------------------------------------------

# Python float constants as a user writes them: (spelling, value), simplest first.
CONSTANTS = [
    ("2.0", 2.0), ("0.5", 0.5), ("3", 3), ("0.1", 0.1), ("1 / 3", 1 / 3), ("1e-5", 1e-5),
    ("0.7978845608", 0.7978845608), ("1e-12", 1e-12), ("1e12", 1e12), ("1e-3", 1e-3),
    ("1e3", 1e3), ("0.044715", 0.044715), ("1e-8", 1e-8), ("1e8", 1e8), ("1e-6", 1e-6),
    ("1e6", 1e6), ("math.sqrt(2.0)", math.sqrt(2.0)), ("math.pi", math.pi), ("255.0", 255.0),
    ("0.25", 0.25), ("7.0", 7.0), ("-1.5", -1.5), ("1.0", 1.0), ("0.3", 0.3),
    ("1 / 7", 1 / 7), ("2.5e-4", 2.5e-4), ("1e-4", 1e-4), ("1e4", 1e4), ("1e-10", 1e-10),
    ("1e10", 1e10), ("0.9999999", 0.9999999), ("1.0000001", 1.0000001), ("0.0", 0.0),
]
SMALL = [c for c in CONSTANTS if 0 < abs(c[1]) <= 0.1]


@dataclass
class Val:
    """A value of the program being generated."""

    name: str
    shape: tuple
    kind: str = "f"      # f, i, b
    pos: bool = False    # > 0 by construction
    mag: float = 1.0     # rough typical magnitude
    contig: bool = True
    lo: int = 0          # integer values: range
    hi: int = 0
    fixed: bool = False  # float32 whatever the program's dtype (a `.float()` cast)


def _bcast(a: tuple, b: tuple) -> tuple | None:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(reversed(out))


def _symbolic(shape: tuple) -> int:
    return sum(1 for d in shape if not isinstance(d, int))


class _Gen:
    """The generator's state: the statements so far and the pool of values."""

    def __init__(self, ch: Chooser, seed: Any, index: int, half: str = "float16"):
        self.ch = ch
        self.seed, self.index = seed, index
        self.dtype = half if ch.chance(0.2) else "float32"
        self.overflow = self.dtype == "float16" and ch.chance(0.25)
        # Magnitudes a value may reach, and what exp may be given, without overflowing
        # (bfloat16 has float32's range).
        if self.dtype != "float16":
            self.budget, self.explim = 1e25, 30.0
        elif self.overflow:
            self.budget, self.explim = 1e9, 20.0
        else:
            self.budget, self.explim = 2e3, 6.0
        self.batch = ch.pick([3, 2])
        self.batch2 = ch.pick([7, 9])
        self.n = ch.pick([8, 4, 6, 16])
        self.t = ch.pick([5, 4])
        self.inputs: list[InputSpec] = []
        self.params: list[ParamSpec] = []
        self.stmts: list[Stmt] = []
        self.vals: list[Val] = []
        self.counters: dict[str, int] = {}
        self.names: set[str] = set()
        self.byname: dict[str, Val] = {}

    # -- bookkeeping --------------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        k = self.counters.get(prefix, 0)
        self.counters[prefix] = k + 1
        name = f"{prefix}{k}"
        self.names.add(name)
        return name

    def emit(self, text: str, val: Val, extra_defs: tuple = ()) -> Val:
        tokens = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text))
        defs = (val.name, *extra_defs)
        uses = tuple(sorted((tokens & self.names) - set(defs)))
        floats = [self.byname[u] for u in uses if u in self.byname
                  and self.byname[u].kind == "f"]
        if val.kind == "f" and floats and all(f.fixed for f in floats):
            val.fixed = True
        self.stmts.append(Stmt(text, defs, uses))
        self.vals.append(val)
        self.byname[val.name] = val
        return val

    def const(self, pool=None, limit: float | None = None, nonzero: bool = True):
        """A constant (spelling, value); ``limit`` bounds its magnitude."""
        pool = pool or CONSTANTS
        ok = [c for c in pool if (not nonzero or c[1] != 0)
              and (limit is None or abs(c[1]) <= limit)]
        return self.ch.pick(ok or [("2.0", 2.0)])

    def cap(self, mag: float) -> float:
        return max(min(mag, 1e300), 1e-300)

    def fits(self, mag: float) -> bool:
        return mag <= self.budget

    def pick(self, kind: str = "f", pred: Callable[[Val], bool] | None = None) -> Val | None:
        """A value of the pool (the most recent ones first, where shrinking goes)."""
        pool = [v for v in reversed(self.vals) if v.kind == kind and (pred is None or pred(v))]
        if not pool:
            return None
        if self.ch.chance(0.5):
            return pool[0]
        return pool[self.ch.int(0, len(pool) - 1)]

    def new_input(self, shape: tuple, kind: str = "f", positive: bool = False,
                  lo: int = 0, hi: int = 1) -> Val:
        prefix = {"f": "x", "i": "i", "b": "m"}[kind]
        name = self.fresh(prefix)
        scale = 1.0
        domain = "any"
        if kind == "f":
            scales = [1.0, 3.0, 0.5, 1e-3, 100.0] if self.dtype != "float16" or self.overflow \
                else [1.0, 3.0, 0.5, 1e-2, 10.0]
            scale = self.ch.pick(scales)
            if positive:
                domain = self.ch.pick(["observed", "positive"])
        self.inputs.append(InputSpec(name, shape, kind, domain, scale, lo, hi))
        val = Val(name, shape, kind, pos=positive, mag=scale * (1 if positive else 3),
                  lo=lo, hi=hi)
        self.vals.append(val)
        self.byname[name] = val
        return val

    def new_param(self, shape: tuple, positive: bool = False, scale: float = 1.0) -> Val:
        name = self.fresh("p")
        dims = ", ".join(map(str, shape)) if shape else "()"
        init = f"torch.rand({dims}) + 0.5" if positive else f"torch.randn({dims})"
        if scale != 1.0 and not positive:
            init += f" * {scale:g}"
        self.params.append(ParamSpec(name, f"self.{name} = nn.Parameter({init})", scale,
                                     positive))
        val = Val(f"self.{name}", shape, "f", pos=positive,
                  mag=(1.5 if positive else 3) * scale)
        self.byname[name] = val
        return val

    def partner(self, shape: tuple, positive: bool = False) -> Val:
        """A float operand that broadcasts against ``shape`` (from the pool or new)."""
        if self.ch.chance(0.6):
            w = self.pick("f", lambda v: _bcast(shape, v.shape) == shape
                          and (v.pos or not positive))
            if w is not None:
                return w
        options = [shape]
        if shape and isinstance(shape[-1], int):
            options += [(shape[-1],), (1, shape[-1])] if len(shape) >= 2 else []
        target = self.ch.pick(options)
        if _symbolic(target) == 0 and self.ch.chance(0.5):
            return self.new_param(target, positive, scale=self.ch.pick([1.0, 0.1]))
        return self.new_input(target, "f", positive)

    def out(self, shape: tuple, kind: str = "f", **kw) -> Val:
        return Val(self.fresh("v"), shape, kind, **kw)

    def dim(self, v: Val, avoid_batch: bool = False) -> tuple[int, str] | None:
        """A dimension of ``v`` (its index, and how it is spelled)."""
        dims = [i for i in range(len(v.shape)) if not (avoid_batch and
                                                       not isinstance(v.shape[i], int))]
        if not dims:
            return None
        rank = len(v.shape)
        i = dims[-1] if self.ch.chance(0.5) else self.ch.pick(dims[::-1])
        spelled = str(i - rank) if self.ch.chance(0.6) else str(i)
        return i, spelled

    # -- ops ----------------------------------------------------------------------------

    def op_unary(self) -> Val | None:
        v = self.pick("f")
        forms = [("-{v}", False), ("torch.neg({v})", False), ("{v}.abs()", False),
                 ("torch.relu({v})", False), ("torch.tanh({v})", False),
                 ("torch.sigmoid({v})", True), ("F.relu({v})", False), ("{v}.relu()", False),
                 ("{v}.tanh()", False), ("{v}.sigmoid()", True), ("torch.abs({v})", False),
                 ("torch.sin({v})", False), ("torch.erf({v})", False)]
        text, pos = self.ch.pick(forms)
        bounded = any(k in text for k in ("tanh", "sigmoid", "sin", "erf"))
        o = self.out(v.shape, pos=pos, mag=1.0 if bounded else v.mag, contig=True)
        return self.emit(f"{o.name} = " + text.format(v=v.name), o)

    def op_const(self) -> Val | None:
        v = self.pick("f")
        form = self.ch.pick(["mul", "add", "rmul", "sub", "rsub", "div", "torch.mul",
                             "method.mul", "torch.add", "method.div"])
        if form in ("mul", "rmul", "torch.mul", "method.mul"):
            c, cv = self.const(limit=self.budget / v.mag)
            mag = v.mag * abs(cv) if cv else 0.0
            text = {"mul": "{v} * {c}", "rmul": "{c} * {v}", "torch.mul": "torch.mul({v}, {c})",
                    "method.mul": "{v}.mul({c})"}[form]
        elif form in ("div", "method.div"):
            c, cv = self.const(pool=[k for k in CONSTANTS if k[1] != 0
                                     and v.mag / abs(k[1]) <= self.budget])
            mag = v.mag / abs(cv)
            text = "{v} / {c}" if form == "div" else "{v}.div({c})"
        else:
            c, cv = self.const(limit=self.budget, nonzero=False)
            mag = v.mag + abs(cv)
            text = {"add": "{v} + {c}", "sub": "{v} - {c}", "rsub": "{c} - {v}",
                    "torch.add": "torch.add({v}, {c})"}[form]
        pos = v.pos and form in ("mul", "rmul", "div", "torch.mul", "method.mul",
                                 "method.div") and cv > 0
        o = self.out(v.shape, pos=pos, mag=self.cap(mag), contig=True)
        return self.emit(f"{o.name} = " + text.format(v=v.name, c=c), o)

    def op_chain(self) -> Val | None:
        v = self.pick("f")
        m = v.mag
        forms = [
            ("({v} * {c} + 1) * {ic}", "small-inverse", m + 1),
            ("{v} * 0.1 * 3", None, m * 0.3),
            ("torch.exp({v} * {c}) - 1", "exp-small", None),
            ("{v} * 1e-12 + {v}", None, m),
            ("{v} + 1 / 3", None, m + 1),
            ("{v} * {c} * {c2}", "two", None),
            ("({v} + {c}) - {c}", "one", None),
            ("{v} * {c} / {c}", "one", m),
            ("{v} / {c} * {c}", "one", m),
            ("{v} - {v} * {c}", "one", None),
            ("{v} * 1e12 * 1e-12", "big", m),
            ("0.5 * {v} * (1 + torch.tanh(0.7978845608 * ({v} + 0.044715 * {v} ** 3)))",
             "cube", m),
            ("{v} * torch.sigmoid(1.702 * {v})", None, m),
            ("{v} * torch.sigmoid({v})", None, m),
            ("torch.log(torch.exp({v}) + 1)", "exp", m + 1),
            ("1 / (1 + torch.exp(-{v}))", "exp", 1.0),
            ("(torch.exp({v}) - torch.exp(-{v})) / (torch.exp({v}) + torch.exp(-{v}))",
             "exp", 1.0),
            ("{v} * 1e-12", None, m * 1e-12),
            ("{v} * {c} + {v} * {c2}", "two", None),
            ("{v} * 0.7978845608 + 1e-5", None, m + 1e-5),
        ]
        text, need, mag = self.ch.pick(forms)
        c = c2 = ic = "1.0"
        if need == "small-inverse":
            c, cv = self.ch.pick([("1e-5", 1e-5), ("1e-3", 1e-3), ("0.1", 0.1), ("1e-8", 1e-8)])
            ic = {"1e-5": "1e5", "1e-3": "1e3", "0.1": "10", "1e-8": "1e8"}[c]
            mag = m + 1 / cv
        elif need == "exp-small":
            c, cv = self.const(pool=SMALL + [("1.0", 1.0)])
            if m * cv > self.explim:
                return None
            mag = math.exp(m * cv)
        elif need == "two":
            c, cv = self.const(limit=math.sqrt(self.budget / m))
            c2, cv2 = self.const(limit=math.sqrt(self.budget / m))
            mag = m * (abs(cv * cv2) + abs(cv) + abs(cv2))
        elif need == "one":
            c, cv = self.const(pool=[k for k in CONSTANTS if k[1] != 0
                                     and m * max(abs(k[1]), 1 / abs(k[1])) <= self.budget])
            mag = mag if mag is not None else m * (1 + abs(cv)) + abs(cv)
        elif need == "big":
            if m * 1e12 > self.budget and not self.overflow:
                return None
        elif need == "cube":
            if m ** 3 > self.budget:
                return None
        elif need == "exp":
            if m > self.explim:
                return None
        if mag is None or not (self.fits(mag) or self.overflow):
            return None
        o = self.out(v.shape, mag=self.cap(mag))
        return self.emit(f"{o.name} = " + text.format(v=v.name, c=c, c2=c2, ic=ic), o)

    def op_binary(self) -> Val | None:
        a = self.pick("f")
        form = self.ch.pick(["add", "sub", "mul", "div", "torch.add", "method.sub",
                             "torch.mul", "div-abs", "maximum", "minimum", "alpha"])
        b = self.partner(a.shape, positive=form == "div")
        shape = _bcast(a.shape, b.shape)
        if shape is None:
            return None
        pos = False
        if form in ("add", "torch.add", "alpha"):
            mag = a.mag + b.mag
            pos = a.pos and b.pos
        elif form in ("sub", "method.sub"):
            mag = a.mag + b.mag
        elif form in ("mul", "torch.mul"):
            mag = a.mag * b.mag
            pos = a.pos and b.pos
        elif form == "div":
            mag = a.mag / 0.05
            pos = a.pos
        elif form == "div-abs":
            c, cv = self.const(pool=[k for k in CONSTANTS if 0 < k[1] <= 1])
            mag = a.mag / cv if cv >= 0.1 else a.mag * 10
        else:
            mag = max(a.mag, b.mag)
        if not self.fits(mag) and not self.overflow:
            return None
        text = {"add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "div": "{a} / {b}",
                "torch.add": "torch.add({a}, {b})", "method.sub": "{a}.sub({b})",
                "torch.mul": "torch.mul({a}, {b})", "maximum": "torch.maximum({a}, {b})",
                "minimum": "torch.minimum({a}, {b})", "alpha": "torch.add({a}, {b}, alpha=2)",
                "div-abs": "{a} / ({b}.abs() + {c})"}[form]
        if form == "div-abs":
            text = text.replace("{c}", c)
        o = self.out(shape, pos=pos, mag=self.cap(mag))
        return self.emit(f"{o.name} = " + text.format(a=a.name, b=b.name), o)

    def op_explog(self) -> Val | None:
        v = self.pick("f")
        m = v.mag
        kind = self.ch.pick(["exp", "log", "sqrt", "pow", "clamp", "expm1", "log1p",
                             "leaky", "pow-pos", "rsqrt"])
        pos, mag = False, m
        if kind == "exp":
            if m <= self.explim or (self.overflow and self.ch.chance(0.5)):
                text = self.ch.pick(["torch.exp({v})", "{v}.exp()"])
                mag, pos = math.exp(min(m, 700)), True
            else:
                c, _ = self.const(pool=[k for k in CONSTANTS if 0 < k[1] <= self.explim])
                text = self.ch.pick(["torch.exp(-{v}.abs())", "torch.exp({v}.clamp(max=%s))" % c,
                                     "torch.exp(torch.tanh({v}))"])
                mag, pos = math.exp(1) if "tanh" in text else max(1.0, math.exp(
                    min(float(eval(c, {"math": math})), 700))), True  # noqa: S307 - our own text
        elif kind == "log":
            if v.pos:
                text = self.ch.pick(["torch.log({v})", "{v}.log()", "torch.log({v} + 1e-5)"])
            else:
                c, _ = self.const(pool=[k for k in CONSTANTS if 0 < k[1] <= 10])
                text = self.ch.pick([
                    "torch.log({v}.abs() + %s)" % c, "torch.log({v} * {v} + %s)" % c,
                    "torch.log1p({v}.abs())", "torch.log(1 + {v}.abs())",
                    "torch.log(torch.sigmoid({v}))", "torch.log(torch.exp({v}))",
                    "torch.log(torch.softmax({v}, -1))", "torch.log1p(torch.exp({v}))"])
                if "exp" in text and m > self.explim:
                    return None
            mag = math.log(max(m, 2.0)) + 30
        elif kind == "sqrt":
            if v.pos:
                text = self.ch.pick(["torch.sqrt({v})", "{v}.sqrt()", "{v} ** 0.5"])
            else:
                c, _ = self.const(pool=[k for k in CONSTANTS if 0 < k[1] <= 10])
                text = self.ch.pick(["torch.sqrt({v} * {v} + %s)" % c, "torch.sqrt({v}.abs())",
                                     "torch.sqrt({v} ** 2)", "({v} * {v}).sqrt()"])
                if m * m > self.budget and not self.overflow:
                    return None
            mag, pos = math.sqrt(m) + 1, v.pos
        elif kind == "rsqrt":
            c, cv = self.const(pool=[k for k in CONSTANTS if 1e-6 <= k[1] <= 10])
            text = "torch.rsqrt({v} * {v} + %s)" % c
            if m * m > self.budget and not self.overflow:
                return None
            mag, pos = 1 / math.sqrt(cv), True
        elif kind == "pow":
            e = self.ch.pick(["2", "3", "2.0"])
            text = self.ch.pick(["{v} ** %s" % e, "torch.pow({v}, %s)" % e, "{v}.pow(%s)" % e,
                                 "{v} * {v}"])
            p = 2 if "*" in text and "**" not in text else float(e)
            mag = m ** p
            if not self.fits(mag) and not self.overflow:
                return None
        elif kind == "pow-pos":
            if not v.pos:
                return None
            e = self.ch.pick(["0.5", "1 / 3", "1.5", "-1", "-0.5", "2.5"])
            text = "{v} ** %s" % e
            mag, pos = max(m, 1 / 0.05) ** 2.5, True
            if not self.fits(mag) and not self.overflow:
                return None
        elif kind == "clamp":
            top = 6e4 if self.dtype == "float16" else math.inf
            c, cv = self.const(pool=[k for k in CONSTANTS if 0 < k[1] <= top])
            text = self.ch.pick(["{v}.clamp(min=-%s, max=%s)" % (c, c),
                                 "torch.clamp({v}, min=0)", "torch.clamp({v}, -%s, %s)" % (c, c),
                                 "{v}.clamp(max=%s)" % c, "torch.clamp({v}, min=%s)" % c])
            mag = min(m, cv) if "max" in text or ", -" in text else max(m, cv)
            pos = "min=%s" % c in text
        elif kind == "expm1":
            if m > self.explim:
                return None
            text = self.ch.pick(["torch.expm1({v})", "torch.exp({v}) - 1", "{v}.expm1()"])
            mag = math.exp(m)
        elif kind == "log1p":
            text = self.ch.pick(["torch.log1p({v}.abs())", "torch.log1p({v})" if v.pos
                                 else "torch.log1p({v}.abs())", "torch.log(1 + {v}.abs())"])
            mag = math.log1p(m) + 1
        else:  # leaky
            c, _ = self.const(pool=SMALL)
            text = "torch.where({v} > 0, {v}, {v} * %s)" % c
        o = self.out(v.shape, pos=pos, mag=self.cap(mag))
        return self.emit(f"{o.name} = " + text.format(v=v.name), o)

    def op_reduce(self) -> Val | None:
        v = self.pick("f", lambda v: len(v.shape) >= 1)
        if v is None:
            return None
        d = self.dim(v)
        i, ds = d
        size = _size(v.shape[i], self.batch2)
        kind = self.ch.pick(["sum", "mean", "amax", "sum-all", "max-values", "amin",
                             "sum-dims", "max-getitem"])
        keep = self.ch.chance(0.5)
        kd = ", keepdim=True" if keep else ""
        shape = tuple(1 if j == i else s for j, s in enumerate(v.shape)) if keep else \
            tuple(s for j, s in enumerate(v.shape) if j != i)
        mag = v.mag
        if kind == "sum":
            text = self.ch.pick(["{v}.sum(%s%s)", "torch.sum({v}, dim=%s%s)"]) % (ds, kd)
            mag = v.mag * size
        elif kind == "mean":
            text = self.ch.pick(["{v}.mean(%s%s)", "torch.mean({v}, dim=%s%s)"]) % (ds, kd)
        elif kind == "amax":
            text = self.ch.pick(["{v}.amax(%s%s)", "torch.amax({v}, dim=%s%s)"]) % (ds, kd)
        elif kind == "amin":
            text = "{v}.amin(%s%s)" % (ds, kd)
        elif kind == "max-values":
            text = "{v}.max(dim=%s%s).values" % (ds, kd)
        elif kind == "max-getitem":
            text = "{v}.max(%s%s)[0]" % (ds, kd)
        elif kind == "sum-all":
            text = self.ch.pick(["{v}.sum()", "torch.sum({v})", "{v}.mean()"])
            shape = ()
            mag = v.mag * math.prod(_size(s, self.batch2) for s in v.shape)
        else:
            if len(v.shape) < 2:
                return None
            text = "{v}.sum(dim=(0, -1)%s)" % kd
            idx = {0, len(v.shape) - 1}
            shape = tuple(1 if j in idx else s for j, s in enumerate(v.shape)) if keep else \
                tuple(s for j, s in enumerate(v.shape) if j not in idx)
            mag = v.mag * math.prod(_size(v.shape[j], self.batch2) for j in idx)
        if not self.fits(mag) and not self.overflow:
            return None
        o = self.out(shape, pos=v.pos and kind != "sum-dims", mag=self.cap(mag))
        return self.emit(f"{o.name} = " + text.format(v=v.name), o)

    def op_softmax(self) -> Val | None:
        v = self.pick("f", lambda v: len(v.shape) >= 1)
        if v is None:
            return None
        i, ds = self.dim(v)
        size = _size(v.shape[i], self.batch2)
        kind = self.ch.pick(["softmax", "log_softmax", "logsumexp", "naive-softmax",
                             "shifted-softmax", "naive-lse", "shifted-lse", "lse-sub"])
        naive_ok = v.mag <= self.explim or self.overflow
        n = v.name
        if kind == "softmax":
            text = self.ch.pick(["torch.softmax({v}, %s)", "F.softmax({v}, dim=%s)",
                                 "{v}.softmax(%s)"]) % ds
            o = self.out(v.shape, pos=True, mag=1.0)
        elif kind == "log_softmax":
            text = self.ch.pick(["F.log_softmax({v}, dim=%s)", "torch.log_softmax({v}, %s)",
                                 "torch.log(torch.softmax({v}, %s))"]) % ds
            o = self.out(v.shape, mag=2 * v.mag + math.log(size) + 1)
        elif kind == "logsumexp":
            keep = self.ch.chance(0.5)
            text = "torch.logsumexp({v}, %s%s)" % (ds, ", keepdim=True" if keep else "")
            shape = tuple(1 if j == i else s for j, s in enumerate(v.shape)) if keep else \
                tuple(s for j, s in enumerate(v.shape) if j != i)
            o = self.out(shape, mag=v.mag + math.log(size) + 1)
        elif kind == "naive-softmax":
            if not naive_ok:
                return None
            text = "torch.exp({v}) / torch.exp({v}).sum(%s, keepdim=True)" % ds
            o = self.out(v.shape, pos=True, mag=1.0)
        elif kind == "shifted-softmax":
            e = self.fresh("v")
            o = self.out(v.shape, pos=True, mag=1.0)
            text = (f"{e} = torch.exp({n} - {n}.amax({ds}, keepdim=True))\n"
                    f"{o.name} = {e} / {e}.sum({ds}, keepdim=True)")
            return self.emit(text, o, extra_defs=(e,))
        elif kind == "naive-lse":
            if not naive_ok:
                return None
            text = "torch.log(torch.exp({v}).sum(%s))" % ds
            shape = tuple(s for j, s in enumerate(v.shape) if j != i)
            o = self.out(shape, mag=v.mag + math.log(size) + 1)
        elif kind == "shifted-lse":
            mx = self.fresh("v")
            o = self.out(tuple(1 if j == i else s for j, s in enumerate(v.shape)),
                         mag=v.mag + math.log(size) + 1)
            text = (f"{mx} = {n}.amax({ds}, keepdim=True)\n"
                    f"{o.name} = {mx} + torch.log(torch.exp({n} - {mx}).sum({ds}, "
                    "keepdim=True))")
            return self.emit(text, o, extra_defs=(mx,))
        else:
            text = "{v} - torch.logsumexp({v}, %s, keepdim=True)" % ds
            o = self.out(v.shape, mag=2 * v.mag + math.log(size) + 1)
        return self.emit(f"{o.name} = " + text.format(v=n), o)

    def op_var(self) -> Val | None:
        v = self.pick("f", lambda v: any(d != 1 for d in v.shape) and self.fits(v.mag * v.mag))
        if v is None:
            return None
        i, ds = self.dim(v)
        if v.shape[i] == 1:
            return None
        n = v.name
        kind = self.ch.pick(["var", "var-unbiased", "var-correction", "manual-var",
                             "one-pass-var", "layer-norm", "F.layer_norm", "rms"])
        keep = self.ch.chance(0.5)
        kd = ", keepdim=True" if keep else ""
        red = tuple(1 if j == i else s for j, s in enumerate(v.shape)) if keep else \
            tuple(s for j, s in enumerate(v.shape) if j != i)
        mag2 = v.mag * v.mag
        if kind == "var":
            o = self.out(red, mag=mag2)
            text = f"{o.name} = {n}.var({ds}{kd})"
        elif kind == "var-unbiased":
            o = self.out(red, mag=mag2)
            text = f"{o.name} = torch.var({n}, dim={ds}, unbiased=False{kd})"
        elif kind == "var-correction":
            o = self.out(red, mag=mag2)
            text = f"{o.name} = {n}.var({ds}, correction=0{kd})"
        elif kind == "manual-var":
            o = self.out(v.shape[:i] + (1,) + v.shape[i + 1:], mag=mag2)
            text = (f"{o.name} = (({n} - {n}.mean({ds}, keepdim=True)) ** 2)"
                    f".mean({ds}, keepdim=True)")
        elif kind == "one-pass-var":
            o = self.out(v.shape[:i] + (1,) + v.shape[i + 1:], mag=mag2)
            text = (f"{o.name} = ({n} * {n}).mean({ds}, keepdim=True) - "
                    f"{n}.mean({ds}, keepdim=True) ** 2")
        elif kind == "layer-norm":
            mu, var = self.fresh("v"), self.fresh("v")
            o = self.out(v.shape, mag=10.0)
            eps, _ = self.ch.pick([("1e-5", 0), ("1e-6", 0), ("1e-12", 0)])
            text = (f"{mu} = {n}.mean(-1, keepdim=True)\n"
                    f"{var} = (({n} - {mu}) ** 2).mean(-1, keepdim=True)\n"
                    f"{o.name} = ({n} - {mu}) / torch.sqrt({var} + {eps})")
            return self.emit(text, o, extra_defs=(mu, var))
        elif kind == "F.layer_norm":
            last = v.shape[-1]
            if not isinstance(last, int):
                return None
            o = self.out(v.shape, mag=10.0)
            text = f"{o.name} = F.layer_norm({n}, ({last},))"
        else:
            o = self.out(v.shape, mag=10.0)
            text = f"{o.name} = {n} * torch.rsqrt({n}.pow(2).mean(-1, keepdim=True) + 1e-6)"
        return self.emit(text, o)

    def op_matmul(self) -> Val | None:
        v = self.pick("f", lambda v: len(v.shape) >= 1 and isinstance(v.shape[-1], int)
                      and not v.fixed)
        if v is None:
            return None
        k = v.shape[-1]
        m = self.ch.pick([6, 8, 4, k])
        kind = self.ch.pick(["param", "linear", "F.linear", "input", "self", "bmm"])
        n = v.name
        mag = v.mag * 3
        if not self.fits(mag) and not self.overflow:
            return None
        scale = round(1 / math.sqrt(k), 3)
        if kind == "param":
            w = self.new_param((k, m), scale=scale)
            o = self.out(v.shape[:-1] + (m,), mag=mag)
            text = self.ch.pick(["{v} @ {w}", "torch.matmul({v}, {w})", "{v}.matmul({w})"])
            text = f"{o.name} = " + text.format(v=n, w=w.name)
        elif kind == "linear":
            name = self.fresh("lin")
            bias = self.ch.chance(0.7)
            self.params.append(ParamSpec(name, f"self.{name} = nn.Linear({k}, {m}"
                                         f"{'' if bias else ', bias=False'})", scale))
            o = self.out(v.shape[:-1] + (m,), mag=mag)
            text = f"{o.name} = self.{name}({n})"
        elif kind == "F.linear":
            w = self.new_param((m, k), scale=scale)
            o = self.out(v.shape[:-1] + (m,), mag=mag)
            if self.ch.chance(0.5):
                b = self.new_param((m,), scale=0.1)
                text = f"{o.name} = F.linear({n}, {w.name}, {b.name})"
            else:
                text = f"{o.name} = F.linear({n}, {w.name})"
        elif kind == "input":
            w = self.new_input((k, m))
            mag = v.mag * w.mag * math.sqrt(k)
            if not self.fits(mag) and not self.overflow:
                return None
            o = self.out(v.shape[:-1] + (m,), mag=mag)
            text = f"{o.name} = {n} @ {w.name}"
        elif kind == "self":
            if len(v.shape) < 2:
                return None
            mag = v.mag * v.mag * k
            if not self.fits(mag) and not self.overflow:
                return None
            o = self.out(v.shape[:-1] + (v.shape[-2],), mag=mag)
            text = self.ch.pick([f"{o.name} = {n} @ {n}.transpose(-1, -2)",
                                 f"{o.name} = torch.matmul({n}, {n}.transpose(-2, -1)) * "
                                 f"{1 / math.sqrt(k)!r}"])
        else:
            if len(v.shape) != 3:
                return None
            w = self.new_input((v.shape[0], k, m))
            mag = v.mag * w.mag * math.sqrt(k)
            if not self.fits(mag) and not self.overflow:
                return None
            o = self.out((v.shape[0], v.shape[1], m), mag=mag)
            text = f"{o.name} = torch.bmm({n}, {w.name})"
        o.mag = self.cap(o.mag)
        return self.emit(text, o)

    def op_view(self) -> Val | None:
        v = self.pick("f", lambda v: len(v.shape) >= 2)
        if v is None:
            return None
        n, s = v.name, v.shape
        rank = len(s)
        kind = self.ch.pick(["transpose", "flatten-view", "unpack", "reshape-last", "unsqueeze",
                             "split-last", "permute", "t", "squeeze", "contiguous", "unflatten"])
        o = None
        if kind == "transpose":
            a, b = self.ch.pick([(-1, -2), (0, 1), (rank - 2, rank - 1)])
            sh = list(s)
            sh[a], sh[b] = sh[b], sh[a]
            o = self.out(tuple(sh), mag=v.mag, pos=v.pos, contig=False)
            text = self.ch.pick([f"{n}.transpose({a}, {b})", f"torch.transpose({n}, {a}, {b})"])
        elif kind == "t":
            if rank != 2:
                return None
            o = self.out((s[1], s[0]), mag=v.mag, pos=v.pos, contig=False)
            text = f"{n}.t()"
        elif kind == "permute":
            if rank != 3:
                return None
            perm = self.ch.pick([(0, 2, 1), (1, 0, 2), (2, 0, 1)])
            o = self.out(tuple(s[p] for p in perm), mag=v.mag, pos=v.pos, contig=False)
            text = f"{n}.permute{perm}"
        elif kind == "flatten-view":
            if rank != 3 or _symbolic(s[1:]) or _symbolic(s) > 1:
                return None
            o = self.out((s[0], s[1] * s[2]), mag=v.mag, pos=v.pos)
            view = "view" if v.contig else "reshape"
            text = self.ch.pick([f"{n}.{view}({n}.size(0), -1)", f"{n}.flatten(1)",
                                 f"{n}.reshape({n}.shape[0], -1)"])
        elif kind == "unpack":
            if rank != 3 or _symbolic(s[1:]) or s[0] != "B":
                return None
            b, t, c = self.fresh("b"), self.fresh("t"), self.fresh("c")
            o = self.out((f"B*{s[1]}", s[2]), mag=v.mag, pos=v.pos)
            text = (f"{b}, {t}, {c} = {n}.shape\n"
                    f"{o.name} = {n}.reshape({b} * {t}, {c})")
            return self.emit(text, o, extra_defs=(b, t, c))
        elif kind == "reshape-last":
            if _symbolic(s[1:]) or s[0] != "B" or rank != 3:
                return None
            o = self.out((f"B*{s[1]}", s[2]), mag=v.mag, pos=v.pos)
            text = f"{n}.reshape(-1, {s[2]})"
        elif kind == "unflatten":
            if rank != 2 or not isinstance(s[0], str) or "*" not in s[0]:
                return None
            k = int(s[0].split("*")[1])
            o = self.out(("B", k, s[1]), mag=v.mag, pos=v.pos)
            text = f"{n}.{'view' if v.contig else 'reshape'}(-1, {k}, {s[1]})"
        elif kind == "split-last":
            last = s[-1]
            if not isinstance(last, int) or last % 2 or rank != 2 or s[0] != "B":
                return None
            o = self.out(("B", 2, last // 2), mag=v.mag, pos=v.pos)
            text = self.ch.pick([f"{n}.reshape({n}.shape[0], 2, -1)",
                                 f"{n}.reshape(-1, 2, {last // 2})"])
        elif kind == "unsqueeze":
            if rank >= 3:
                return None
            d = self.ch.pick([1, -1, 0])
            sh = list(s)
            sh.insert(d if d >= 0 else len(sh), 1)
            o = self.out(tuple(sh), mag=v.mag, pos=v.pos, contig=v.contig)
            text = self.ch.pick([f"{n}.unsqueeze({d})", f"torch.unsqueeze({n}, {d})"])
        elif kind == "squeeze":
            ones = [i for i, d in enumerate(s) if d == 1]
            if not ones:
                return None
            i = ones[-1]
            o = self.out(tuple(d for j, d in enumerate(s) if j != i), mag=v.mag, pos=v.pos,
                         contig=v.contig)
            text = f"{n}.squeeze({i - rank})"
        else:
            if v.contig:
                return None
            o = self.out(s, mag=v.mag, pos=v.pos)
            text = f"{n}.contiguous()"
        return self.emit(f"{o.name} = {text}", o)

    def op_index(self) -> Val | None:
        v = self.pick("f", lambda v: len(v.shape) >= 2 and isinstance(v.shape[-1], int))
        if v is None:
            return None
        n, s = v.name, v.shape
        last = s[-1]
        kind = self.ch.pick(["col", "prefix", "gather", "from1", "last0", "mid0", "batch0",
                             "neg", "step", "cat", "gather-method"])
        if kind == "col":
            if not isinstance(s[1], int):
                return None
            o = self.out((s[0],) + s[2:], mag=v.mag, pos=v.pos)
            text = f"{n}[:, 0]"
        elif kind == "prefix":
            k = self.ch.int(1, max(1, last - 1))
            o = self.out(s[:-1] + (k,), mag=v.mag, pos=v.pos, contig=False)
            text = f"{n}[..., :{k}]"
        elif kind == "from1":
            if not isinstance(s[1], int) or s[1] < 2:
                return None
            o = self.out((s[0], s[1] - 1) + s[2:], mag=v.mag, pos=v.pos, contig=False)
            text = f"{n}[:, 1:]"
        elif kind == "last0":
            o = self.out(s[:-1], mag=v.mag, pos=v.pos, contig=False)
            text = f"{n}[..., 0]"
        elif kind == "mid0":
            if len(s) != 3:
                return None
            o = self.out(s[:2], mag=v.mag, pos=v.pos, contig=False)
            text = f"{n}[:, :, 0]"
        elif kind == "batch0":
            o = self.out(s[1:], mag=v.mag, pos=v.pos)
            text = f"{n}[0]"
        elif kind == "neg":
            if not isinstance(s[1], int):
                return None
            o = self.out((s[0],) + s[2:], mag=v.mag, pos=v.pos, contig=False)
            text = f"{n}[:, -1]"
        elif kind == "step":
            o = self.out(s[:-1] + ((last + 1) // 2,), mag=v.mag, pos=v.pos, contig=False)
            text = f"{n}[..., ::2]"
        elif kind == "cat":
            w = self.partner(s)
            if w.shape != s:
                return None
            o = self.out(s[:-1] + (2 * last,), mag=max(v.mag, w.mag), pos=v.pos and w.pos)
            text = self.ch.pick([f"torch.cat([{n}, {w.name}], dim=-1)",
                                 f"torch.cat(({n}, {w.name}), -1)"])
        else:
            k = self.ch.pick([1, 3, last])
            idx = self.new_input(s[:-1] + (k,), "i", lo=0, hi=last - 1)
            o = self.out(s[:-1] + (k,), mag=v.mag, pos=v.pos)
            text = (f"torch.gather({n}, -1, {idx.name})" if kind == "gather"
                    else f"{n}.gather({len(s) - 1}, {idx.name})")
        return self.emit(f"{o.name} = {text}", o)

    def op_embedding(self) -> Val | None:
        vocab = self.ch.pick([10, 17])
        shape = self.ch.pick([("B",), ("B", self.t)])
        ids = self.new_input(shape, "i", lo=0, hi=vocab - 1)
        dim = self.ch.pick([self.n, 4])
        if self.ch.chance(0.5):
            name = self.fresh("emb")
            self.params.append(ParamSpec(name, f"self.{name} = nn.Embedding({vocab}, {dim})"))
            text = f"self.{name}({ids.name})"
        else:
            w = self.new_param((vocab, dim))
            text = f"F.embedding({ids.name}, {w.name})"
        o = self.out(shape + (dim,), mag=3.0)
        return self.emit(f"{o.name} = {text}", o)

    def int_val(self) -> Val:
        i = self.pick("i", lambda v: v.hi - v.lo < 10_000)
        if i is None or self.ch.chance(0.2):
            shape = self.ch.pick([("B", self.n), ("B",)])
            i = self.new_input(shape, "i", lo=-8, hi=8)
        return i

    def float_like(self) -> str:
        """A float value whose dtype a cast may take (``.to(x.dtype)``)."""
        f = self.pick("f")
        return f.name if f is not None else ""

    def op_int(self) -> Val | None:
        kind = self.ch.pick(["int-arith", "compare-float", "cast", "where", "masked_fill",
                             "int-binary", "compare-int", "int-reduce", "bool-count",
                             "mixed", "not", "floor"])
        if kind == "int-arith":
            i = self.int_val()
            form, lo, hi = self.ch.pick([
                ("{i} + 1", i.lo + 1, i.hi + 1), ("{i} * 3", 3 * i.lo, 3 * i.hi),
                ("{i} - 2", i.lo - 2, i.hi - 2), ("{i} // 2", i.lo // 2, i.hi // 2),
                ("{i} % 3", 0, 2), ("torch.remainder({i}, 5)", 0, 4),
                ("-{i}", -i.hi, -i.lo), ("{i}.abs()", 0, max(abs(i.lo), abs(i.hi))),
                ("{i} * {i}", 0, max(i.lo * i.lo, i.hi * i.hi))])
            o = self.out(i.shape, "i", lo=lo, hi=hi)
            return self.emit(f"{o.name} = " + form.format(i=i.name), o)
        if kind == "int-binary":
            i = self.int_val()
            j = self.pick("i", lambda v: _bcast(i.shape, v.shape) is not None
                          and v.hi - v.lo < 10_000) or i
            shape = _bcast(i.shape, j.shape)
            form = self.ch.pick(["{i} + {j}", "{i} - {j}", "torch.maximum({i}, {j})",
                                 "{i} * {j}"])
            bound = max(abs(i.lo), abs(i.hi)) + max(abs(j.lo), abs(j.hi))
            if "*" in form:
                bound = max(abs(i.lo), abs(i.hi)) * max(abs(j.lo), abs(j.hi))
            o = self.out(shape, "i", lo=-bound, hi=bound)
            return self.emit(f"{o.name} = " + form.format(i=i.name, j=j.name), o)
        if kind == "compare-int":
            i = self.int_val()
            form = self.ch.pick(["{i} > 2", "{i} == 0", "torch.eq({i}, 1)", "{i} <= -1",
                                 "{i} != 3"])
            o = self.out(i.shape, "b")
            return self.emit(f"{o.name} = " + form.format(i=i.name), o)
        if kind == "int-reduce":
            i = self.pick("i", lambda v: len(v.shape) >= 1 and v.hi - v.lo < 10_000)
            if i is None:
                return None
            form = self.ch.pick(["{i}.sum(-1)", "{i}.amax(-1)", "torch.sum({i}, 0)"])
            d = 0 if "0)" in form else len(i.shape) - 1
            size = _size(i.shape[d], self.batch2)
            bound = max(abs(i.lo), abs(i.hi)) * size
            o = self.out(tuple(s for j, s in enumerate(i.shape) if j != d), "i",
                         lo=-bound, hi=bound)
            return self.emit(f"{o.name} = " + form.format(i=i.name), o)
        if kind == "compare-float":
            v = self.pick("f")
            c, _ = self.const(limit=max(v.mag, 1.0), nonzero=False)
            form = self.ch.pick(["{v} > 0", "{v} < %s" % c, "torch.gt({v}, 0)",
                                 "{v}.ge(%s)" % c, "{v} <= -%s" % c])
            o = self.out(v.shape, "b")
            return self.emit(f"{o.name} = " + form.format(v=v.name), o)
        if kind == "bool-count":
            m = self.pick("b", lambda v: len(v.shape) >= 1)
            if m is None:
                return None
            o = self.out(m.shape[:-1], "i", lo=0, hi=_size(m.shape[-1], self.batch2))
            return self.emit(f"{o.name} = {m.name}.sum(-1)", o)
        if kind == "not":
            m = self.pick("b")
            if m is None:
                return None
            o = self.out(m.shape, "b")
            return self.emit(f"{o.name} = " + self.ch.pick(["~{m}", "torch.logical_not({m})"])
                             .format(m=m.name), o)
        if kind == "cast":
            src = self.pick("b") if self.ch.chance(0.4) else None
            src = src or self.int_val()
            like = self.float_like()
            form = self.ch.pick(["{s}.to({f}.dtype)", "{s}.float()", "{s}.type_as({f})",
                                 "{s}.long()"])
            if "{f}" in form and not like:
                form = "{s}.float()"
            if form == "{s}.long()":
                if src.kind != "b":
                    return None
                o = self.out(src.shape, "i", lo=0, hi=1)
            else:
                bound = 1 if src.kind == "b" else max(abs(src.lo), abs(src.hi), 1)
                o = self.out(src.shape, mag=float(bound), fixed=form == "{s}.float()")
            return self.emit(f"{o.name} = " + form.format(s=src.name, f=like), o)
        if kind == "floor":
            v = self.pick("f", lambda v: v.mag < 1e6)
            if v is None:
                return None
            o = self.out(v.shape, mag=v.mag * 4 + 1)
            return self.emit(f"{o.name} = ({v.name} * 4).floor()", o)
        if kind == "mixed":
            v = self.pick("f")
            i = self.pick("i", lambda w: _bcast(v.shape, w.shape) == v.shape
                          and max(abs(w.lo), abs(w.hi)) < 100)
            if i is None:
                return None
            mag = v.mag * max(abs(i.lo), abs(i.hi), 1)
            if not self.fits(mag):
                return None
            o = self.out(v.shape, mag=mag)
            return self.emit(f"{o.name} = {v.name} * {i.name}", o)
        # where / masked_fill: a mask from the pool or a fresh comparison
        a = self.pick("f")
        m = self.pick("b", lambda w: _bcast(a.shape, w.shape) == a.shape)
        cond = m.name if m is not None else None
        if cond is None:
            cond = f"{a.name} > 0"
        if kind == "where":
            form = self.ch.pick(["b", "scalar", "zero"])
            if form == "b":
                b = self.partner(a.shape)
                shape = _bcast(a.shape, b.shape)
                text = f"torch.where({cond}, {a.name}, {b.name})"
                mag = max(a.mag, b.mag)
            else:
                c = "0.0" if form == "zero" else self.const(limit=self.budget)[0]
                text = f"torch.where({cond}, {a.name}, {c})"
                shape, mag = a.shape, max(a.mag, abs(eval(c, {"math": math})))  # noqa: S307
        else:
            fill = ["0.0", "-1e4", "1.0"] + (["-1e9", "float('-inf')"]
                                             if self.dtype != "float16" else [])
            c = self.ch.pick(fill)
            if "(" in cond:
                cond = f"({cond})"
            text = f"{a.name}.masked_fill({cond}, {c})"
            shape, mag = a.shape, max(a.mag, 1e4 if "e" in c else 1.0)
        if not self.fits(mag) and not self.overflow:
            return None
        o = self.out(shape, mag=mag)
        return self.emit(f"{o.name} = {text}", o)

    # Simplest first (where shrinking goes); the common kinds twice.
    OPS = ("op_unary", "op_const", "op_binary", "op_chain", "op_explog", "op_reduce",
           "op_softmax", "op_var", "op_matmul", "op_view", "op_index", "op_int",
           "op_embedding", "op_unary", "op_const", "op_binary", "op_chain", "op_explog",
           "op_softmax", "op_view")

    def run(self) -> Program:
        ch = self.ch
        first = ch.pick([("B", self.n), ("B", self.t, self.n), ("B", self.n),
                         ("B", self.t, self.n), ("B", self.n), "embedding"])
        if first == "embedding":
            self.op_embedding()
        else:
            self.new_input(first, "f", positive=ch.chance(0.2))
        if ch.chance(0.3):
            self.new_input(self.ch.pick([first if first != "embedding" else ("B", self.n),
                                         ("B", self.n)]), "f", positive=ch.chance(0.3))
        steps = ch.int(1, 10)
        for _ in range(steps):
            for _attempt in range(4):
                op = getattr(self, ch.pick(self.OPS))
                if op() is not None:
                    break
        produced = [v for v in self.vals if v.name.startswith("v")]
        if not produced:
            self.op_unary()
            produced = [v for v in self.vals if v.name.startswith("v")]
        # The last value, and (up to two) other values nothing uses, so that few
        # statements are dead.
        used = {u for st in self.stmts for u in st.uses}
        sinks = [v.name for v in produced[-2::-1] if v.name not in used]
        outputs = [produced[-1].name] + sinks[:ch.int(0, 2)]
        prog = Program(self.seed, self.index, self.dtype, self.batch, self.batch2,
                       self.inputs, self.params, self.stmts, outputs, self.overflow)
        return prog.sliced(outputs)


def program_from(lines: Sequence[str], inputs: Sequence[InputSpec], dtype: str = "float32",
                 batch: int = 3, batch2: int = 7) -> Program:
    """A hand-written program (one assignment per line, the last one returned), for
    repros and for testing the judge.

    >>> p = program_from(["v0 = x0 * 1e-12"], [InputSpec("x0", ("B", 8), "f")])
    >>> print(p.source.split("\\n\\n\\n")[1].strip())
    def program(x0):
        v0 = x0 * 1e-12
        return v0
    """
    names = {s.name for s in inputs}
    stmts = []
    for line in lines:
        name = line.split("=")[0].strip()
        tokens = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", line))
        stmts.append(Stmt(line, (name,), tuple(sorted(tokens & names))))
        names.add(name)
    return Program("manual", 0, dtype, batch, batch2, list(inputs), [], stmts,
                   [stmts[-1].defs[0]])


def judge_callable(prog: Program, fn: Callable) -> list[Outcome]:
    """Run ``fn`` (standing for an optimised ``prog``) on ``prog``'s fresh inputs and
    judge it: the outcomes that are not right (empty when it is)."""
    src = prog.build()
    cases = _cases(prog, src, torch.fx.symbolic_trace(src))
    outcomes: list[Outcome] = []
    _run_and_judge(fn, cases, prog, "run", "callable", outcomes)
    return outcomes


def generate(chooser: Chooser, seed: Any = "h", index: int = 0, half: str = "float16"
             ) -> Program:
    """A random program from ``chooser``'s choices; a fifth of them in ``half``
    ("float16" or "bfloat16"), the others in float32."""
    return _Gen(chooser, seed, index, half).run()


def program(seed: int, index: int, half: str = "float16") -> Program:
    """Program ``index`` of seed ``seed`` (reproducible; with ``half="bfloat16"`` the
    same choices, bfloat16 where they pick float16)."""
    return generate(RandomChooser(random.Random(f"fuzz:{seed}:{index}")), seed, index, half)


def programs():
    """A hypothesis strategy of programs (shrinks to short, simple ones)."""
    from hypothesis import strategies as st

    @st.composite
    def strategy(draw):
        return generate(DrawChooser(draw))

    return strategy()


# -- the pipeline and the judge ---------------------------------------------------------


def cost_models() -> list[tuple[str, Any]]:
    """Every cost model ``extractors`` exports that applies to an FX e-graph (and the two
    combinators), fresh instances."""
    from extractors import (
        AstDepth,
        AstSize,
        Curvature,
        Flops,
        Lexicographic,
        Memory,
        PeakMemory,
        Roofline,
    )

    return [("AstSize", AstSize()), ("AstDepth", AstDepth()), ("Flops", Flops()),
            ("Memory", Memory()), ("PeakMemory", PeakMemory()), ("Curvature", Curvature()),
            ("Roofline(H100)", Roofline("H100")),
            ("Flops+1e-3*Memory", Flops() + 1e-3 * Memory()),
            ("Lexicographic(Curvature,Flops)", Lexicographic(Curvature(), Flops()))]


@dataclass
class Outcome:
    """One check of one program: category, stage (``where``), the cost model or path, and
    what went wrong (the exception, the fallback reason, or the worst element)."""

    category: str
    where: str = ""
    path: str = ""
    error: str = ""
    kind: str = ""       # exception type, or the kind of wrong answer
    rewrites: tuple = ()
    code: str = ""       # the emitted module's code (extraction paths)

    def key(self) -> tuple:
        """What makes two failures the same kind (numbers blanked out; for an error that
        wraps another, as torch.compile's BackendCompilerFailed does, the inner one)."""
        kind, msg = self.kind, ""
        if self.category != "wrong":
            lines = [line for line in self.error.split("\n") if line.strip()]
            msg = lines[0] if lines else ""
            if msg.endswith("raised:") and len(lines) > 1:
                msg = lines[1]
                kind = f"{kind}({msg.split(':')[0]})"
        msg = msg.split("; rewrites involved")[0]
        msg = re.sub(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b", "#", msg)
        msg = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", msg)[:160]
        where = self.where.split("(")[0]
        return (self.category, where, kind, msg)


@dataclass
class Result:
    """All the checks of one program."""

    program: Program
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def worst(self) -> str:
        if not self.outcomes:
            return "ok"
        return max((o.category for o in self.outcomes), key=_SEVERITY.__getitem__)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.category in ("wrong", "crash", "invalid")]


_RULES = None


def rules():
    global _RULES
    if _RULES is None:
        from egraph.rules import load_rules

        _RULES = load_rules("all")
    return _RULES


@dataclass
class _Case:
    """A fresh input set with what the source and the reference give on it."""

    label: str
    batch: int
    inputs: tuple
    src: list
    ref: list
    spread: list[list]
    unresolved: list         # per output, what float64 itself cannot resolve
    shared: list[bool]       # per output, whether the source's shares an input's storage
    contiguous: list[bool]   # per output, whether the source's is contiguous
    together: set            # pairs of outputs whose tensors share storage in the source's
    kept: list[bool]         # per input, whether the source's run leaves it as it was


def _flat(out: Any) -> list:
    leaves: list = []
    torch.fx.node.map_aggregate(out, leaves.append)
    return leaves


def _clone(xs: tuple) -> tuple:
    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in xs)


def _reference(fn) -> Any:
    if isinstance(fn, nn.Module):
        return copy.deepcopy(fn).to(torch.float64)
    return fn


def _to64(xs: tuple) -> tuple:
    return tuple(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                 for x in xs)


def _cases(prog: Program, fn, gm: torch.fx.GraphModule, samples: int = 4) -> list[_Case]:
    """Fresh inputs (not the example inputs): two sets at the batch size the program was
    built for (the second with both signs for inputs only observed positive), one at a
    second batch size where the source runs there; with the source's result, the float64
    reference, and ``samples`` Monte Carlo runs of the source (its rounding spread) and of
    the reference (what float64 leaves unresolved)."""
    ref_fn = _reference(fn)
    cases = []
    for label, tag, batch in (("fresh", "fresh", prog.batch), ("mixed", "mixed", prog.batch),
                              (f"batch {prog.batch2}", "fresh2", prog.batch2)):
        xs = prog.make_inputs(tag, batch)
        gen = torch.Generator().manual_seed(_seed(prog.seed, prog.index, tag, "mca"))
        try:
            with torch.no_grad():
                given = _clone(xs)
                src = _flat(fn(*given))
                ref = _flat(ref_fn(*_to64(xs)))
                spread = rounding_samples(gm, _clone(xs), samples, gen)
                unresolved = reference_spread(gm, xs, ref)
        except Exception:
            if batch != prog.batch:
                continue  # the program itself does not run at this size
            raise
        cases.append(_Case(label, batch, xs, src, ref, spread, unresolved,
                           [_shares_input(o, given) for o in src],
                           [isinstance(o, torch.Tensor) and o.is_contiguous() for o in src],
                           sharing_pairs(src), [_unchanged(a, b) for a, b in zip(given, xs)]))
    return cases


def _unchanged(after: Any, before: Any) -> bool:
    """``after`` holds what ``before`` held, NaN for NaN (a non-tensor always does)."""
    if not isinstance(after, torch.Tensor) or not isinstance(before, torch.Tensor):
        return True
    if after.shape != before.shape or after.dtype != before.dtype:
        return False
    same = after == before
    if after.is_floating_point():
        same |= after.isnan() & before.isnan()
    return bool(same.all())


def _changed_inputs(after: tuple, before: tuple, kept: list[bool] | None = None) -> list[int]:
    """The positions of the inputs that ``after`` holds changed from ``before``, of those
    ``kept`` (by default all) says the source leaves as they were."""
    kept = kept if kept is not None else [True] * len(before)
    return [i for i, (a, b, k) in enumerate(zip(after, before, kept))
            if k and not _unchanged(a, b)]


def _shares_input(out: Any, inputs: tuple) -> bool:
    """Whether ``out`` is a tensor sharing storage with one of ``inputs``."""
    if not isinstance(out, torch.Tensor):
        return False
    ptr = out.untyped_storage().data_ptr()
    return any(isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() == ptr
               for x in inputs)


def _layout_verdict(got: list, given: tuple, case: _Case) -> tuple[str, str] | None:
    """What an output changed beyond its value: it shares an input's storage where the
    source's is a new tensor (a caller writing into it writes into its input), or another
    output's where the source's two are tensors of their own (a caller writing into one
    changes the other), or it is not contiguous where the source's is (a caller's ``view``
    of it fails)."""
    joined = sorted(sharing_pairs(got) - case.together)
    if joined:
        return "aliasing", (f"outputs {joined[0][0]} and {joined[0][1]} share one storage; "
                            "the source's do not")
    for k, g in enumerate(got):
        if k >= len(case.shared) or not isinstance(g, torch.Tensor):
            continue
        if _shares_input(g, given) and not case.shared[k]:
            return "aliasing", (f"output {k} shares an input's storage; the source's is a "
                                "new tensor")
        if case.contiguous[k] and not g.is_contiguous():
            return "layout", (f"output {k} is not contiguous (strides {g.stride()}); the "
                              "source's is")
    return None


def judge(got: list, case: _Case) -> tuple[str, str] | None:
    """``(kind, description)`` of the worst wrong element, or None when ``got`` is right."""
    if len(got) != len(case.src):
        return "structure", f"{len(got)} outputs, the source gives {len(case.src)}"
    for k, (g, s, r) in enumerate(zip(got, case.src, case.ref)):
        spread = [sp[k] for sp in case.spread]
        if not isinstance(s, torch.Tensor):
            if g != s:
                return "value", f"output {k}: {g!r}, the source gives {s!r}"
            continue
        if not isinstance(g, torch.Tensor):
            return "structure", f"output {k} is a {type(g).__name__}, not a tensor"
        if g.shape != s.shape:
            return "shape", f"output {k} has shape {tuple(g.shape)}, the source {tuple(s.shape)}"
        if g.dtype != s.dtype:
            return "dtype", f"output {k} has dtype {g.dtype}, the source {s.dtype}"
        if not s.is_floating_point():
            bad = g != s
            if r.dtype == s.dtype or not r.is_floating_point():
                bad &= g != r.to(s.dtype)
            for sp in spread:
                bad &= g != sp
            if bad.any():
                i = _first(bad)
                return "value", (f"output {k} ({s.dtype}) element {i}: {g[i].item()}, the "
                                 f"source gives {s[i].item()} (reference {r[i].item()})")
            continue
        verdict = _judge_float(g, s, r, spread, case.unresolved[k])
        if verdict is not None:
            return verdict[0], f"output {k}: {verdict[1]}"
    return None


def _first(mask: torch.Tensor) -> tuple:
    return tuple(int(i) for i in mask.nonzero()[0]) if mask.dim() else ()


def _judge_float(g, s, r, spread, unresolved=None) -> tuple[str, str] | None:
    fi = torch.finfo(s.dtype)
    eps, tiny = fi.eps, fi.tiny
    r = r.double()
    fin = torch.isfinite(r)
    # What float64 cannot resolve (compiler.validate.reference_spread): a value within the
    # reference's own Monte Carlo spread of it is not in error (the reference cancels
    # where the program does not).
    if unresolved is None:
        unresolved = torch.zeros_like(r)

    def rel(a):
        a = a.double()
        e = ((a - r).abs() - unresolved).clamp(min=0) / r.abs().clamp(min=tiny)
        return torch.where(torch.isfinite(a) | ~fin, e, torch.full_like(e, math.inf)).nan_to_num(
            nan=math.inf)

    err_src = rel(s)
    for sp in spread:
        err_src = torch.maximum(err_src, rel(sp))
    err = rel(g)
    # The contract validation promises (README, "Float constants"), on inputs validation
    # never saw: each element within ELEMENTWISE_SLACK times the source's worst element,
    # the output normwise within twice the source's, plus 64 roundings either way.
    tol = 64 * eps
    worst_src = float(err_src[fin].max()) if fin.any() else 0.0
    # A subnormal result holds fewer digits than the format's: within the subnormal
    # range of its reference it is rounding noise (an erf' of 1e-36 times a softmax
    # gradient of 1e-7, with products summed in another order), as flush-to-zero would be
    subnormal = (r.abs() < tiny) & ((g.double() - r).abs() < tiny)
    wrong = fin & ~subnormal & (err > ELEMENTWISE_SLACK * worst_src + tol)
    if fin.any():
        scale = r[fin].abs().max().clamp(min=tiny)

        def normwise(a):
            off = ((a.double() - r).abs() - unresolved).clamp(min=0)
            off = torch.where((r.abs() < tiny) & (off < tiny), 0.0, off)  # (subnormal)
            return float(off[fin].nan_to_num(nan=math.inf).max() / scale)

        source_normwise = max(map(normwise, [s, *spread]))
        # (an output the source cancels to rounding noise, with no correct digit, such as
        # the sum of a layer norm's output, is judged with validation's wider slack)
        slack = NORMWISE_SLACK["invented" if source_normwise > 1 else "given"]
        if normwise(g) > slack * source_normwise + tol:
            difference = (g.double() - r).abs().nan_to_num(nan=math.inf)
            wrong = wrong | (fin & (difference == difference[fin].max()))
    nonfinite = fin & torch.isfinite(s) & ~torch.isfinite(g)
    # Where the reference overflows and the source agrees with it, the result may be
    # finite (a stable form) but not NaN or the other infinity.
    inf_ref = torch.isinf(r) & (s.double() == r)
    flipped = inf_ref & (torch.isnan(g) | (torch.isinf(g) & (g.double() != r)))
    bad = wrong | nonfinite | flipped
    if not bad.any():
        return None
    score = torch.where(bad, (err / (err_src + eps)).nan_to_num(nan=math.inf, posinf=1e300),
                        torch.zeros_like(err))
    i = tuple(int(j) for j in torch.unravel_index(score.argmax(), score.shape)) \
        if score.dim() else ()
    kind = "nonfinite" if (nonfinite | flipped)[i] else "value"
    return kind, (f"element {i}: got {g[i].item()!r}, float64 reference {r[i].item()!r}, "
                  f"source {s[i].item()!r}; relative error {err[i].item():.3g} vs the "
                  f"source's {err_src[i].item():.3g} ({int(bad.sum())} of {bad.numel()} "
                  "elements wrong)")


def _exc(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) < 1500 else text[:1500] + " ..."


def _size_refusal(e: BaseException, built_for: int) -> bool:
    """A clear refusal of other sizes: our own SizeMismatch (it names the input, its shape
    and the shape the module was built for, which may be a size derived from the batch),
    or a message that names the batch size the program was built for."""
    if type(e).__name__ == "SizeMismatch":
        return True
    msg = str(e)
    return bool(_SIZE_REFUSAL.search(msg)) and str(built_for) in msg


def _run_and_judge(fn, cases: list[_Case], prog: Program, where: str, path: str,
                   outcomes: list[Outcome], rewrites: tuple = (), compiled: bool = False
                   ) -> bool:
    """Run ``fn`` on each case; record wrong answers and crashes. True if all were right."""
    ok = True
    code = getattr(fn, "code", "") if isinstance(fn, torch.fx.GraphModule) else ""
    for case in cases:
        try:
            # A GraphModule prints its own traceback to stderr: the outcome has it.
            with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
                given = _clone(case.inputs)
                got = _flat(fn(*given))
        except Exception as e:  # noqa: BLE001 - a crash is what we are looking for
            if not compiled and case.batch != prog.batch and _size_refusal(e, prog.batch):
                outcomes.append(Outcome("clear-refusal", f"{where}({case.label})", path,
                                        _exc(e), type(e).__name__, code=code))
                continue
            outcomes.append(Outcome("crash", f"{where}({case.label})", path,
                                    _exc(e) + "\n" + _short_tb(e), type(e).__name__,
                                    rewrites, code))
            ok = False
            continue
        changed = _changed_inputs(given, case.inputs, case.kept)
        verdict = judge(got, case) or _layout_verdict(got, given, case) or (
            ("input-written", f"inputs {changed} changed, which the source leaves as "
                              "they were") if changed else None)
        if verdict is not None:
            outcomes.append(Outcome("wrong", f"{where}({case.label})", path, verdict[1],
                                    verdict[0], rewrites, code))
            ok = False
    return ok


_PACKAGES = ("egraph/", "frontends/", "backends/", "extractors/")


def _short_tb(e: BaseException, frames: int = 4) -> str:
    """Where it was raised: the deepest frames in the project's packages, and the last."""
    tb = traceback.extract_tb(e.__traceback__)
    ours = [f for f in tb if any(p in f.filename for p in _PACKAGES)
            and ".venv" not in f.filename and "site-packages" not in f.filename]
    picked = ours[-frames:]
    if tb and (not picked or picked[-1] is not tb[-1]):
        picked.append(tb[-1])
    return "".join(f"  at {_short_path(f.filename)}:{f.lineno} in {f.name}\n"
                   for f in picked).rstrip()


def _short_path(path: str) -> str:
    for p in _PACKAGES + ("site-packages/", "tests/"):
        if p in path:
            return p + path.split(p, 1)[1] if not p.endswith("-packages/") else \
                path.split(p, 1)[1]
    return path


def _egraph_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("egraph:")]


def check(prog: Program, costs: list[tuple[str, Any]] | None = None,
          torch_compile: bool = False,
          limits: dict | None = None, compile_cost: tuple[str, Any] | None = None,
          torch_export: bool = False, torch_train: bool = False) -> Result:
    """``prog`` through the pipeline under every cost model (and torch.compile when
    ``torch_compile``; torch.export with the batch size dynamic when ``torch_export``;
    training steps through torch.compile at three batch sizes, static, automatic dynamic
    and dynamic, when ``torch_train``), each result judged on fresh inputs. Never raises
    for the pipeline's failures: they are outcomes."""
    from egraph import EGraph

    t0 = time.perf_counter()
    res = Result(prog)
    limits = {**LIMITS, **(limits or {})}
    costs = cost_models() if costs is None else costs
    # The program itself must run (in its dtype and in float64): otherwise the
    # generator is at fault, not the pipeline.
    try:
        fn = prog.build()
        gm = torch.fx.symbolic_trace(fn)
        xs = prog.make_inputs("example")
        cases = _cases(prog, fn, gm)
    except Exception as e:  # noqa: BLE001
        res.outcomes.append(Outcome("invalid", "generate", "", _exc(e) + "\n" + _short_tb(e),
                                    type(e).__name__))
        res.seconds = time.perf_counter() - t0
        return res
    stage = "ingest"
    examples = _clone(xs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eg = EGraph.from_fx(gm, xs, domains=prog.domains or None)
            stage = "saturate"
            eg.saturate(rules(), **limits)
    except Exception as e:  # noqa: BLE001
        from frontends.fx import UntraceableModel

        cat = "clear-refusal" if isinstance(e, UntraceableModel) else "crash"
        res.outcomes.append(Outcome(cat, stage, "", _exc(e) + "\n" + _short_tb(e),
                                    type(e).__name__))
        eg = None
    for name, cost in costs if eg is not None else ():
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = eg.extract(cost)
        except Exception as e:  # noqa: BLE001
            res.outcomes.append(Outcome("crash", "extract", name,
                                        _exc(e) + "\n" + _short_tb(e), type(e).__name__))
            continue
        _judge_extracted(out, caught, cases, prog, ("extract", "run"), name, res.outcomes)
    changed = _changed_inputs(xs, examples)
    if changed:  # (ingest, saturation, extraction and validation only read them)
        res.outcomes.append(Outcome("wrong", "pipeline", "", f"the example inputs {changed} "
                                    "changed", "input-written"))
    if torch_compile:
        _check_compile(prog, cases, res, limits, compile_cost)
    if torch_export:
        _check_export(prog, cases, res, limits)
    if torch_train:
        train_cases = _train_cases(prog)
        for dynamic in TRAIN_MODES:
            _check_train(prog, train_cases, res, limits, dynamic)
    res.seconds = time.perf_counter() - t0
    return res


def _check_export(prog: Program, cases: list[_Case], res: Result, limits: dict) -> None:
    """``prog`` through torch.export with its batch size a ``Dim`` (the graph's sizes are
    symbolic), then the pipeline under the default cost model; the program must give the
    source's results at both batch sizes. A program torch.export cannot capture with a
    dynamic batch (it specialises the batch, or guards on data) is torch's limit, not an
    outcome."""
    from torch.export import Dim

    from compiler.compile import default_cost
    from egraph import EGraph

    path = "export[dynamic batch]"
    fn = prog.build()
    module = fn if isinstance(fn, nn.Module) else _Wrapped(fn)
    xs = prog.make_inputs("example")
    batch = Dim("batch", min=2, max=64)

    def dims(spec: InputSpec):
        picked = {i: batch if d == "B" else batch * int(d.split("*")[1])
                  for i, d in enumerate(spec.shape) if isinstance(d, str)}
        return picked or None

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            shapes = tuple(dims(s) for s in prog.inputs)
            program = torch.export.export(  # (a function's inputs are one *args)
                module, xs, dynamic_shapes=shapes if module is fn else (shapes,)).module()
    except Exception:  # noqa: BLE001 - torch.export's own limits
        return
    stage = "export-ingest"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            placeholders = [n.name for n in program.graph.nodes if n.op == "placeholder"]
            domains = {placeholders[i]: prog.domains[spec.name]  # (export renames inputs)
                       for i, spec in enumerate(prog.inputs) if spec.name in prog.domains}
            eg = EGraph.from_fx(program, xs, domains=domains or None)
            stage = "export-saturate"
            eg.saturate(rules(), **limits)
            stage = "export-extract"
            out = eg.extract(default_cost(xs))
    except Exception as e:  # noqa: BLE001
        res.outcomes.append(Outcome("crash", stage, path, _exc(e) + "\n" + _short_tb(e),
                                    type(e).__name__))
        return
    _judge_extracted(out, caught, cases, prog, ("export", "export"), path, res.outcomes,
                     any_size=True)


def _judge_extracted(out: torch.fx.GraphModule, caught: list, cases: list[_Case],
                     prog: Program, where: tuple[str, str], path: str,
                     outcomes: list[Outcome], any_size: bool = False) -> None:
    """The outcomes of an extracted program: its runs on the cases judged (``where``:
    the stage a fallback is reported at, and the runs'), then a fallback with its reason
    (validation's warning, or the report's), or ok. ``any_size``: the program must run
    at every batch size (a symbolic graph's), so a refusal of one is a crash."""
    report = out.meta.get("egraph_report")
    rewrites = tuple(sorted(getattr(report, "rewrites", {}) or {}))
    fell = _egraph_warnings(caught)
    right = _run_and_judge(out, cases, prog, where[1], path, outcomes, rewrites,
                           compiled=any_size)
    if fell or getattr(report, "fell_back", False):
        reason = fell[0] if fell else ""
        if not reason and report is not None and report.validation is not None:
            reason = report.validation.reason
        outcomes.append(Outcome("fallback", where[0], path, reason, "validation", rewrites))
    elif right and not any(o.path == path and o.category == "clear-refusal"
                           for o in outcomes):
        outcomes.append(Outcome("ok", where[1], path))


class _Wrapped(nn.Module):
    """A generated function as the module torch.export takes."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _check_compile(prog: Program, cases: list[_Case], res: Result, limits: dict,
                   cost: tuple[str, Any] | None) -> None:
    import torch._dynamo

    from compiler.compile import make_backend

    torch._dynamo.reset()
    name, model = cost if cost is not None else ("default", None)
    path = f"torch.compile[{name}]"
    backend = make_backend(rules=rules(), cost=model, **limits)
    fn = prog.build()
    compiled = torch.compile(fn, backend=backend)
    n_before = len(res.outcomes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        right = _run_and_judge(compiled, cases, prog, "compile", path, res.outcomes,
                               compiled=True)
    for o in res.outcomes[n_before:]:
        if o.category == "crash" and not _is_compile_error(o):
            o.where = o.where.replace("compile", "compile-run", 1)
    _conclude(res, caught, "compile", path, right)


def _conclude(res: Result, caught: list, where: str, path: str, right: bool) -> None:
    """A torch.compile path's last outcome: a fallback where the backend warned that
    validation refused its program, ok where every run was judged right; then dynamo's
    caches go, for the next program."""
    fell = _egraph_warnings(caught)
    if fell:
        res.outcomes.append(Outcome("fallback", where, path, fell[0], "validation"))
    elif right:
        res.outcomes.append(Outcome("ok", where, path))
    torch._dynamo.reset()


def _is_compile_error(o: Outcome) -> bool:
    return o.kind in ("BackendCompilerFailed", "InternalTorchDynamoError", "Unsupported",
                      "TorchRuntimeError", "UserError")


# -- training through torch.compile -----------------------------------------------------

TRAIN_MODES = {False: "static", None: "automatic", True: "dynamic"}
"""torch.compile's ``dynamic`` settings the training path runs, by the name its outcomes'
path carries: ``False`` recompiles for each batch size; ``None`` (automatic dynamic)
recompiles at the second size with a symbolic batch, which the third size reuses;
``True`` compiles a symbolic batch from the first call."""


def _floating(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _loss_weights(prog: Program, batch: int, out: list) -> list:
    """The training loss's weights, per output: fixed random values of each floating
    output's shape (seeded by program, size and position), None for the others. A plain
    sum would make every output's gradient ones, which hides a wrong backward of a
    reduction or a broadcast."""
    weights = []
    for k, o in enumerate(out):
        if not _floating(o):
            weights.append(None)
            continue
        gen = torch.Generator().manual_seed(_seed(prog.seed, prog.index, "loss", batch, k))
        weights.append(torch.randn(o.shape, generator=gen, dtype=torch.float64))
    return weights


def _loss(out: list, weights: list) -> torch.Tensor:
    """``sum((out.double() * w).sum())`` over the floating outputs, in float64."""
    return sum((o.double() * w).sum() for o, w in zip(out, weights) if w is not None)


def _train_step(fn: Callable, xs: tuple, weights: list) -> list:
    """One training step of ``fn`` on copies of ``xs``, flat: its outputs, then, after
    ``backward`` of :func:`_loss`, the gradients of its floating inputs and of its
    parameters (zeros for one that gets none, as an input an output does not use)."""
    leaves = tuple(x.detach().clone().requires_grad_() if _floating(x) else x for x in xs)
    params = list(fn.parameters()) if isinstance(fn, nn.Module) else []
    for p in params:
        p.grad = None
    out = _flat(fn(*leaves))
    _loss(out, weights).backward()
    wrt = [x for x in leaves if _floating(x)] + params
    return ([o.detach() if isinstance(o, torch.Tensor) else o for o in out]
            + [w.grad if w.grad is not None else torch.zeros_like(w) for w in wrt])


def _train_graph(fn: Callable, xs: tuple, weights: list) -> tuple[torch.fx.GraphModule, tuple]:
    """:func:`_train_step` as one graph of aten ops (``make_fx``), from the inputs and the
    parameters to the outputs and the gradients, with the arguments it takes: what
    ``rounding_samples`` and ``reference_spread`` run to sample the source's own rounding
    in the backward too, and what float64 cannot resolve there."""
    from torch.fx.experimental.proxy_tensor import make_fx

    params = dict(fn.named_parameters()) if isinstance(fn, nn.Module) else {}
    n = len(xs)

    def step(*args):
        out = _flat(torch.func.functional_call(fn, dict(zip(params, args[n:])), args[:n])
                    if params else fn(*args))
        wrt = [x for x in args if _floating(x)]  # (the floating inputs, the parameters)
        grads = torch.autograd.grad(_loss(out, weights), wrt, allow_unused=True)
        return (*out, *(g if g is not None else torch.zeros_like(w)
                        for g, w in zip(grads, wrt)))

    args = tuple(x.detach() for x in (*xs, *params.values()))
    graph = make_fx(step)(*(x.clone().requires_grad_() if _floating(x) else x for x in args))
    return graph, args


def _train_cases(prog: Program, samples: int = 4) -> list[tuple[_Case, list]]:
    """The sizes the training path runs, in order (the program's two batch sizes and a
    third, ``batch2 + 2``, on fresh inputs), each with the loss's weights and the judge's
    case for the outputs followed by the gradients: the source's in its dtype, the float64
    reference's (the program built afresh in float64), ``samples`` Monte Carlo runs of the
    source's training step (:func:`_train_graph`; none where it cannot be traced) and
    what float64 leaves unresolved. A size where the source does not run (its own
    semantics fix the size) or has nothing to differentiate is left out. Empty for a
    program in half precision (its gradients' rounding noise swamps what the judge could
    tell) or with no floating input and no parameter (nothing to differentiate)."""
    if prog.dtype not in ("float32", "float64") or not (
            prog.params or any(s.kind == "f" for s in prog.inputs)):
        return []
    fn, wide = prog.build(), prog.build()
    wide = wide.double() if isinstance(wide, nn.Module) else wide
    cases = []
    for batch in (prog.batch, prog.batch2, prog.batch2 + 2):
        xs = prog.make_inputs("fresh", batch)
        try:
            with torch.no_grad():
                weights = _loss_weights(prog, batch, _flat(fn(*_clone(xs))))
            src = _train_step(fn, xs, weights)
            ref = _train_step(wide, _to64(xs), weights)
        except Exception:  # noqa: BLE001 - the source itself does not train at this size
            continue
        try:
            graph, args = _train_graph(fn, xs, weights)
        except Exception:  # noqa: BLE001 - no samples: the judge has the source's run
            spread, unresolved = [], [None] * len(ref)
        else:
            gen = torch.Generator().manual_seed(_seed(prog.seed, prog.index, batch, "mca"))
            spread = rounding_samples(graph, args, samples, gen)
            unresolved = reference_spread(graph, args, ref)
        # (layout and aliasing are judged on the other paths)
        cases.append((_Case(f"batch {batch}", batch, xs, src, ref, spread, unresolved,
                            [], [], set(), []), weights))
    return cases


def _check_train(prog: Program, cases: list[tuple[_Case, list]], res: Result, limits: dict,
                 dynamic: bool | None) -> None:
    """Training steps of ``prog`` through torch.compile with the ``egraph`` backend and
    ``dynamic`` (:data:`TRAIN_MODES`), at the sizes of :func:`_train_cases` in their
    order, on one compiled program (as a training loop whose last batch is smaller
    recompiles, or not): each step's outputs and gradients judged against the float64
    reference within the source's own error. An exception from the compiled call or its
    backward is a crash; validation falling back to the source a fallback."""
    import torch._dynamo

    from compiler.compile import make_backend

    if not cases:
        return
    path = f"train[{TRAIN_MODES[dynamic]}]"
    torch._dynamo.reset()
    fn = prog.build()
    names = [s.name for s in prog.inputs if s.kind == "f"] + (
        [n for n, _ in fn.named_parameters()] if isinstance(fn, nn.Module) else [])
    compiled = torch.compile(fn, backend=make_backend(rules=rules(), **limits),
                             dynamic=dynamic)
    right = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for case, weights in cases:
            where = f"train({case.label})"
            try:
                # (a GraphModule prints its own traceback to stderr: the outcome has it)
                with contextlib.redirect_stderr(io.StringIO()):
                    got = _train_step(compiled, case.inputs, weights)
            except Exception as e:  # noqa: BLE001 - a crash is what we are looking for
                res.outcomes.append(Outcome("crash", where, path,
                                            _exc(e) + "\n" + _short_tb(e), type(e).__name__))
                right = False
                continue
            verdict = judge(got, case)
            if verdict is not None:
                res.outcomes.append(Outcome("wrong", where, path,
                                            _gradient_named(verdict[1], case, names),
                                            verdict[0]))
                right = False
    _conclude(res, caught, "train", path, right)


def _gradient_named(error: str, case: _Case, names: list[str]) -> str:
    """``error`` as :func:`judge` words it (``output k: ...``), with an output past the
    program's own named as the gradient it is."""
    first = len(case.src) - len(names)
    return re.sub(r"^output (\d+)", lambda m: m[0] if int(m[1]) < first
                  else f"the gradient of {names[int(m[1]) - first]}", error)


# -- shrinking and reports --------------------------------------------------------------


def shrink(prog: Program, outcome: Outcome, costs=None, torch_compile: bool = False,
           limits: dict | None = None, budget: int = 80, torch_export: bool = False,
           torch_train: bool = False) -> Program:
    """A smaller program that still fails the same way as ``outcome`` (same
    :meth:`Outcome.key`): greedily, slices to one output (only the statements it needs)
    and statements bypassed (``v = f(u)`` becomes ``v = u``), until none of them fails
    or ``budget`` checks are spent."""
    key = outcome.key()
    tried: set[str] = {prog.source}
    spent = 0
    while spent < budget:
        for cand in _smaller(prog):
            if cand.source in tried:
                continue
            tried.add(cand.source)
            spent += 1
            r = check(cand, costs=costs, torch_compile=torch_compile, limits=limits,
                      torch_export=torch_export, torch_train=torch_train)
            if any(o.key() == key for o in r.outcomes):
                prog = cand
                break
            if spent >= budget:
                return _inline_aliases(prog)
        else:
            return _inline_aliases(prog)
    return _inline_aliases(prog)


def _inline_aliases(prog: Program) -> Program:
    """``v1 = x0`` statements removed, later uses renamed (the same program)."""
    stmts, outputs = [], list(prog.outputs)
    rename: dict[str, str] = {}

    def sub(text: str) -> str:
        return re.sub(r"\b[A-Za-z_][A-Za-z_0-9]*\b", lambda m: rename.get(m[0], m[0]), text)

    for st in prog.stmts:
        m = re.fullmatch(r"(\w+) = (\w+)", st.text)
        if m and m[1] not in outputs:
            rename[m[1]] = rename.get(m[2], m[2])
            continue
        stmts.append(Stmt(sub(st.text), st.defs, tuple(rename.get(u, u) for u in st.uses)))
    return replace(prog, stmts=stmts, outputs=[rename.get(o, o) for o in outputs])


def _smaller(prog: Program) -> list[Program]:
    """Candidate one-step reductions of ``prog``, smallest first."""
    out = []
    values = [n for st in prog.stmts for n in st.defs if n.startswith("v")]
    for name in values:
        out.append(prog.sliced([name]))
    for k, st in enumerate(prog.stmts):
        for u in st.uses:
            if u[0] not in "vxim":
                continue  # parameters, submodules and unpacked sizes are not values
            stmts = list(prog.stmts)
            stmts[k] = Stmt(f"{st.defs[0]} = {u}", st.defs[:1], (u,))
            out.append(replace(prog, stmts=stmts).sliced(prog.outputs))
    size = {id(p): (len(p.stmts), len(p.source)) for p in out}
    return sorted((p for p in out if size[id(p)] < (len(prog.stmts), len(prog.source))),
                  key=lambda p: size[id(p)])


def summarize(results: list[Result]) -> dict:
    """Counts per category (per program: its worst outcome; per check: every outcome),
    fallback reasons, and the distinct failure kinds with their shortest program."""
    per_program = {c: 0 for c in CATEGORIES}
    per_check = {c: 0 for c in CATEGORIES}
    kinds: dict[tuple, list] = {}
    reasons: dict[str, int] = {}
    for r in results:
        per_program[r.worst] += 1
        for o in r.outcomes:
            per_check[o.category] += 1
            if o.category == "fallback":
                reason = re.sub(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b", "#", o.error)[:200]
                reasons[reason] = reasons.get(reason, 0) + 1
            if o.category != "ok":
                kinds.setdefault(o.key(), []).append((r, o))
    return {"per_program": per_program, "per_check": per_check, "kinds": kinds,
            "fallback_reasons": reasons}
