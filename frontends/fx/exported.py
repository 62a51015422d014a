"""A torch.export program as a module that runs its graph as exported.

``ExportedProgram.module()`` unlifts the program: it rewrites the graph to read parameters
as attributes, adds a check of the inputs and recompiles the code four times, 0.28 s for
GPT-2 small. Ingest reads the exported graph itself, so the source program it validates
against and emits from need not be unlifted: :class:`ExportedModule` holds the program's
parameters, buffers and constants at their names (the same tensors, not copies) and calls
the exported graph with them and the user's inputs, checking the inputs' static sizes as
the unlifted module does.

>>> import torch
>>> program = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(4, 3),))
>>> module = ExportedModule(program)
>>> module.weight is program.state_dict["weight"]
True
>>> torch.equal(module(torch.ones(4, 3)), program.module()(torch.ones(4, 3)))
True
"""

from __future__ import annotations

from functools import reduce
from typing import Any

import torch
import torch.nn as nn
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils._pytree import tree_unflatten

__all__ = ["ExportedModule", "attribute_at", "written_targets", "owner_of"]


_MUTATIONS = (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION,
              OutputKind.USER_INPUT_MUTATION)


def written_targets(signature) -> list[str | None]:
    """Per output of an export program's graph: the buffer, parameter (updated in place
    under ``no_grad``) or input whose new value it is, or None for an output the user
    gets. By position: one value may be the new value of two tensors, or also an output.

    >>> class Count(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.register_buffer("n", torch.zeros(()))
    ...     def forward(self, x):
    ...         self.n.add_(1)
    ...         return x + self.n
    >>> program = torch.export.export(Count(), (torch.ones(2),)).run_decompositions({})
    >>> written_targets(program.graph_signature)
    ['n', None]
    """
    return [spec.target if spec.kind in _MUTATIONS else None
            for spec in signature.output_specs]


class ExportedModule(nn.Module):
    """``program`` as a module: inputs flat, in order; outputs in the program's structure.

    Parameters stay parameters, buffers stay buffers (persistent or not, as exported) and
    tensor constants are plain attributes, as in ``ExportedProgram.module()``, so its
    ``state_dict`` is the program's. ``program`` is the ExportedProgram, ``graph_module``
    its graph.

    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).eval()
    >>> module = ExportedModule(torch.export.export(model, (torch.randn(4, 3),)))
    >>> sorted(module.state_dict()) == sorted(model.state_dict())
    True
    """

    def __init__(self, program: torch.export.ExportedProgram):
        super().__init__()
        state, constants = program.state_dict, program.constants
        slots: list[str | None] = []  # per graph input: the attribute it reads, or None
        static: list[tuple[int | None, ...] | None] = []
        placeholders = [n for n in program.graph_module.graph.nodes if n.op == "placeholder"]
        for spec, node in zip(program.graph_signature.input_specs, placeholders):
            if spec.kind == InputKind.USER_INPUT:
                slots.append(None)
                value = node.meta.get("val")
                static.append(tuple(d if isinstance(d, int) else None for d in value.shape)
                              if isinstance(value, torch.Tensor) else None)
                continue
            if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER,
                                 InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
                raise NotImplementedError(
                    f"the exported program takes a {spec.kind.name} input ({spec.arg.name}); "
                    "export without effect tokens, or compile the model with "
                    "torch.compile(model, backend='egraph')")
            target = spec.target
            value = state[target] if target in state else constants[target]
            owner, leaf = owner_of(self, target)
            if spec.kind == InputKind.PARAMETER:
                owner.register_parameter(leaf, value)
            elif spec.kind == InputKind.BUFFER:
                owner.register_buffer(leaf, value, persistent=bool(spec.persistent))
            else:
                setattr(owner, leaf, value)
            slots.append(target)
        # Kept out of the module tree: neither holds state of its own.
        object.__setattr__(self, "graph_module", program.graph_module)
        object.__setattr__(self, "program", program)
        self._slots, self._static = slots, static
        self._out_spec = program.call_spec.out_spec
        self._mutations = sum(t is not None for t in written_targets(program.graph_signature))

    def graph_inputs(self, args: tuple) -> list[Any]:
        """The exported graph's inputs: this module's state where the graph reads it, the
        user's ``args`` (checked against the exported static sizes) elsewhere."""
        wanted = self._slots.count(None)
        if len(args) != wanted:
            raise TypeError(f"the exported program takes {wanted} inputs, got {len(args)}")
        users = iter(enumerate(zip(args, self._static)))
        out: list[Any] = []
        for slot in self._slots:
            if slot is not None:
                out.append(attribute_at(self, slot))
                continue
            index, (x, sizes) = next(users)
            if sizes is not None and isinstance(x, torch.Tensor) and (
                    x.dim() != len(sizes)
                    or any(s is not None and s != d for s, d in zip(sizes, x.shape))):
                raise ValueError(f"input {index} has shape "
                                 f"{tuple(x.shape)}; the program was exported for "
                                 f"{tuple('*' if s is None else s for s in sizes)}")
            out.append(x)
        return out

    def forward(self, *args: Any) -> Any:
        flat = self.graph_module(*self.graph_inputs(args))
        return tree_unflatten(list(flat)[self._mutations:], self._out_spec)


def attribute_at(root: nn.Module, path: str) -> Any:
    """The attribute a dotted ``path`` names under ``root`` (``"h.0.attn.weight"``).

    >>> attribute_at(nn.Sequential(nn.Linear(2, 3)), "0.weight").shape
    torch.Size([3, 2])
    """
    return reduce(getattr, path.split("."), root)


def owner_of(root: nn.Module, path: str) -> tuple[nn.Module, str]:
    """The module that holds ``path``'s last part (created empty where missing) and it.

    >>> root = nn.Module()
    >>> owner, leaf = owner_of(root, "a.b.c")
    >>> owner is root.a.b, leaf
    (True, 'c')
    """
    *parents, leaf = path.split(".")
    module = root
    for part in parents:
        child = getattr(module, part, None)
        if child is None:
            child = nn.Module()
            module.add_module(part, child)
        module = child
    return module, leaf
