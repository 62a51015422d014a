"""Launch wrappers: a fused kernel as an ordinary Python function.

A :class:`FusedKernel` is what the emitted GraphModule calls (``fused_softmax_3(x)``). On
CUDA tensors it allocates the outputs, groups the iteration space by the tensors' actual
strides (:func:`~backends.triton.codegen.layout_of`), picks power-of-two block sizes,
generates and compiles the Triton source for that layout once, and launches it. It runs the
region's eager torch ops instead when Triton cannot help: CPU tensors (unless
``TRITON_INTERPRET=1``, when the generated kernel itself runs in Triton's interpreter),
inputs that require grad while grad mode is on (so autograd sees every op), shapes or dtypes
other than those it was generated for, or no Triton installed. Kernels are cached by their
spec (the region's structure, shapes and dtypes); compiled sources by their text.

>>> import torch
>>> from egraph import EGraph
>>> from backends.triton.regions import plan
>>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) * 2),
...                     (torch.randn(3, 5),))
>>> kernel = plan(eg)[0].kernel
>>> x = torch.randn(3, 5)
>>> torch.allclose(kernel(x), torch.exp(x) * 2)
True
"""

from __future__ import annotations

import functools
import linecache
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from backends.triton.codegen import (
    Layout,
    axis_strides,
    block_sizes,
    contiguous_layout,
    generate,
    layout_of,
)
from backends.triton.spec import KernelSpec
from frontends.fx.vocabulary import SPECS


@dataclass(frozen=True)
class Blocks:
    """Block-size limits: whole rows of up to ``row`` elements in one block, ``loop``
    elements per step of a longer row, about ``tile`` elements per program for short rows,
    ``pointwise`` elements per program of a pointwise kernel (powers of two).

    >>> Blocks().row
    8192
    """

    row: int = 8192
    loop: int = 2048
    tile: int = 4096
    pointwise: int = 1024


BLOCKS = Blocks()
"""The limits every launch uses (tests lower them to exercise looped rows on small data)."""

_WIDE = 1 << 31


def interpreting() -> bool:
    """True when ``TRITON_INTERPRET=1``: kernels also run, in Triton's interpreter, on CPU
    tensors.

    >>> isinstance(interpreting(), bool)
    True
    """
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def triton_available() -> bool:
    """True when the ``triton`` package can be imported.

    >>> isinstance(triton_available(), bool)
    True
    """
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


_JIT: dict[tuple[str, bool], Any] = {}


def _compile(source: str, name: str) -> Any:
    """The jit function ``name`` defined by ``source`` (kept in linecache, where Triton
    reads it back)."""
    key = (source, interpreting())
    fn = _JIT.get(key)
    if fn is None:
        import triton
        import triton.language as tl

        filename = f"<egraph-triton {name} {len(_JIT)}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace: dict[str, Any] = {"__name__": f"{__package__}.generated", "triton": triton,
                                     "tl": tl}
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - generated code
        fn = _JIT[key] = namespace[name]
    return fn


class FusedKernel:
    """One generated kernel and its launch wrapper; call it like the region's eager code.

    ``spec`` is what it computes, ``source`` its Triton code for contiguous tensors,
    ``sources`` the code of every layout it has been launched with.

    >>> from egraph import EGraph
    >>> from backends.triton.regions import plan
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.softmax(x, -1) * 3),
    ...                     (torch.randn(2, 6),))
    >>> kernel = plan(eg)[0].kernel
    >>> kernel.__name__.startswith("fused_softmax_mul_")
    True
    >>> x = torch.randn(2, 6)
    >>> torch.allclose(kernel(x), torch.softmax(x, -1) * 3)  # eager ops here: a CPU tensor
    True
    """

    def __init__(self, spec: KernelSpec, name: str):
        self.spec = spec
        self.__name__ = self.__qualname__ = name
        self.__module__ = __name__
        self.sources: dict[Layout, str] = {}
        self._plans: dict[tuple, _Plan] = {}

    def __repr__(self) -> str:
        return f"<fused kernel {self.__name__}>"

    def __deepcopy__(self, memo: dict) -> FusedKernel:
        return self

    @property
    def source(self) -> str:
        """The Triton source launched on contiguous tensors."""
        looped, *_ = self._blocks()
        return generate(self.spec, contiguous_layout(self.spec, looped), self.__name__)

    def _blocks(self):
        b = BLOCKS
        return block_sizes(self.spec, b.row, b.loop, b.tile, b.pointwise)

    def __call__(self, *args: Any) -> Any:
        if not self._launches(args):
            return self.eager(*args)
        return self.launch(*args)

    def _launches(self, args: tuple) -> bool:
        spec = self.spec
        if len(args) != len(spec.inputs) or not all(
                isinstance(a, torch.Tensor) and a.shape == arg.shape and a.dtype == arg.dtype
                for a, arg in zip(args, spec.inputs)):
            return False
        devices = {a.device for a in args}
        if len(devices) != 1:
            return False
        device = next(iter(devices))
        if device.type != "cuda" and not (device.type == "cpu" and interpreting()):
            return False
        if torch.is_grad_enabled() and any(a.requires_grad for a in args):
            return False
        return triton_available()

    def eager(self, *args: torch.Tensor) -> Any:
        """The region computed with torch ops (what runs where the kernel cannot)."""
        values: list[Any] = []

        def get(ref):
            kind, v = ref
            return args[v] if kind == "input" else values[v] if kind == "value" else v

        for op, *refs in self.spec.program:
            values.append(SPECS[op].run([get(r) for r in refs]))
        outs = tuple(values[j] for j in self.spec.results)
        return outs[0] if len(outs) == 1 else outs

    def launch(self, *args: torch.Tensor) -> Any:
        """Run the Triton kernel on ``args`` (same device; CUDA, or CPU when interpreting)."""
        device = args[0].device
        key = (device, tuple(a.stride() for a in args), BLOCKS, interpreting())
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(args)
        outs = [torch.empty(o.shape, dtype=o.dtype, device=device) for o in self.spec.outputs]
        flat: list[Any] = []
        for t, strides in zip([*args, *outs], plan.strides):
            flat.append(t)
            flat += strides
        flat += plan.sizes
        if device.type == "cuda":
            with torch.cuda.device(device):
                plan.kernel[plan.grid](*flat, **plan.blocks, num_warps=plan.warps)
        else:
            # the interpreter computes masked-off lanes too (0 / 0 there is harmless)
            with numpy.errstate(all="ignore"):
                plan.kernel[plan.grid](*flat, **plan.blocks, num_warps=plan.warps)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _plan(self, args: tuple[torch.Tensor, ...]) -> _Plan:
        """How to launch on tensors laid out like ``args``: the layout's compiled kernel,
        each tensor's strides to pass, the group sizes, grid and block sizes."""
        spec = self.spec
        outs = [torch.empty(o.shape, dtype=o.dtype, device="meta") for o in spec.outputs]
        tensors = [*args, *outs]
        looped, blocks, warps, programs = self._blocks()
        wide = any(_extent(t) >= _WIDE for t in tensors)
        strides = [axis_strides(spec, arg, t.stride())
                   for arg, t in zip(spec.inputs + spec.outputs, tensors)]
        layout = layout_of(spec, strides, looped, wide)
        source = self.sources.get(layout)
        if source is None:
            source = self.sources[layout] = generate(spec, layout, self.__name__)
        passed = [[along[g[-1]] for g, keep in zip(layout.groups, strided) if keep]
                  for along, strided in zip(strides, layout.strided)]
        sizes = [math.prod(spec.space[p] for p in g) for g in layout.groups]
        return _Plan(_compile(source, self.__name__), passed, sizes, (programs,), blocks, warps)


@dataclass(frozen=True)
class _Plan:
    kernel: Any
    strides: list[list[int]]
    sizes: list[int]
    grid: tuple[int]
    blocks: dict[str, int]
    warps: int


def _extent(t: torch.Tensor) -> int:
    """One past the largest element offset ``t`` reaches (and at least its size)."""
    reach = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()) if s)
    return max(reach + 1, t.numel())


_KERNELS: dict[KernelSpec, FusedKernel] = {}


def kernel_for(spec: KernelSpec) -> FusedKernel:
    """The kernel of ``spec``, made once per process (``fused_softmax_3``: the name's
    number tells kernels apart).

    >>> from egraph import EGraph
    >>> from backends.triton.regions import plan
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) + 1),
    ...                     (torch.randn(3),))
    >>> kernel = plan(eg)[0].kernel
    >>> kernel_for(kernel.spec) is kernel
    True
    """
    kernel = _KERNELS.get(spec)
    if kernel is None:
        kernel = _KERNELS[spec] = FusedKernel(spec, f"{spec.name}_{len(_KERNELS)}")
    return kernel
