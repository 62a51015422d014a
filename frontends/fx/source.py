"""The source record: what an e-graph built from FX remembers of its source graph for
emission (:class:`FxSource`, on ``eg.fx``), the calls it keeps as they are
(:class:`OpaqueCall`) and what stands for a node in their arguments and the output
(:class:`ClassRef` and its kinds, :class:`AttributeRef`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from frontends.fx.exported import InputGuards

__all__ = ["AttributeRef", "ClassRef", "ContiguousRef", "FxSource", "OpaqueCall", "OutputRef",
           "WrittenRef"]


@dataclass
class OpaqueCall:
    """An FX call kept as is: its target and its arguments with e-class ids for nodes."""

    op: str
    target: Any
    args: Any
    kwargs: Any
    name: str
    pure: bool = False  # functional by torch's op schema: it writes into no argument
    updates: int | None = None  # the class of the input or parameter it updates in place


@dataclass
class FxSource:
    """What an e-graph built from FX remembers of its source graph, for emission.
    ``module`` runs the source (for a torch.export program: :class:`ExportedModule`)."""

    module: nn.Module
    graph_module: fx.GraphModule
    inputs: list[str]
    input_classes: list[int]
    output: Any  # the output structure with class ids in place of nodes
    effects: list[int] = field(default_factory=list)
    opaque: dict[str, OpaqueCall] = field(default_factory=dict)
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    example_inputs: tuple | None = None
    initial: dict[int, list[tuple]] = field(default_factory=dict)
    random: bool = False
    origins: dict[int, str] = field(default_factory=dict)
    domains: dict[str, int] = field(default_factory=dict)
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    guards: InputGuards | None = None  # (an exported source's: its module checks them)
    structure: tuple[list[str], Any] | None = None  # (see exported.input_structure)

    def location(self, cid: int, find) -> str | None:
        """Where in the source a class came from: the FX node, with its module path when
        the graph records one (``blocks.0.attn: softmax``)."""
        cid = find(cid)
        for c, name in self.origins.items():
            if find(c) == cid:
                return name
        return None



@dataclass(frozen=True)
class AttributeRef:
    """An attribute of the source module passed to a call, by its path, where it is no
    tensor and no literal: a submodule (the region of a higher-order op of a torch.export
    graph, ``wrap_with_autocast``, ``wrap_with_set_grad_enabled``, so that the region
    keeps its autocast or grad mode) or an object (the ``torch.Generator`` a call draws
    from, which the emitted call must advance as the source's did). The call stays
    opaque; the emitted module holds the same object."""

    target: str


@dataclass(frozen=True)
class ClassRef:
    """An e-class id standing where an FX node was, in an opaque call's arguments."""

    cid: int


@dataclass(frozen=True)
class WrittenRef(ClassRef):
    """The operand an opaque call updates in place, a value the graph made: the emitted
    call updates a copy of it (the class may be shared by other expressions)."""


@dataclass(frozen=True)
class ContiguousRef(ClassRef):
    """An argument of a functional opaque call that was contiguous in the source: the
    emitted call is given it contiguous too (ingest drops ``clone`` and ``contiguous``,
    which make a layout, not a value), and so is a random op's (it draws in memory
    order, so the layout decides which element gets which draw)."""


@dataclass(frozen=True)
class OutputRef(ClassRef):
    """An output of the source graph: its class, and what the source's tensor was beyond
    its value, which the emitted program keeps. ``fresh``: a tensor the source made (no
    storage shared with an input, a parameter or a constant: ``x * 1``, ``x.clone()``),
    False where it may share one (``x.view(-1)``, an opaque call that may return a view);
    ``contiguous``: whether it was contiguous, None where no example told; ``maker``: the
    name of the source node that made its tensor (outputs of different makers never share
    one: ``zeros_like(x)`` twice, each then written by the caller, may be one class)."""

    fresh: bool = False
    contiguous: bool | None = None
    maker: str | None = None

