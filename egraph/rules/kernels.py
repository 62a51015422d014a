"""Kernels: other library kernels for an op, beside the one torch calls for it, that the
cost model chooses between by this machine's measured curves.

``linear-onednn``: a float32 linear through oneDNN's inner product
(:func:`frontends.fx.kernels.onednn_linear`), which ran GPT-2 small's and BERT-base's
projections 2.2-2.9x faster than torch's linear on an AVX-512 CPU and the projections of a
tiny model 3x slower. Only a profile that measured it (:mod:`extractors.calibration`)
prices it; others never choose it. It reaches every product by a matrix through the
fusion rules ``matmul-linear`` and ``linear-add-bias`` (``addmm``: GPT-2's ``Conv1D``,
aot_autograd's graphs of ``nn.Linear``).

>>> next(r for r in RULES if r.name == "linear-onednn").rewrite
Rewrite('linear-onednn', '(linear ?x ?w ?b)' => '(onednn_linear ?x ?w ?b)')
"""

from __future__ import annotations

from egraph.ops import linear, onednn_linear
from egraph.rules.define import F, LibraryRule, rule
from egraph.rules.guards import single_precision
from egraph.term import vars

__all__ = ["RULES"]

LOADED = "all"
ORDER = 4

x, w, b = vars("x w b")


RULES: list[LibraryRule] = [
    rule("linear-onednn", linear(x, w, b), onednn_linear(x, w, b), when=single_precision(x),
         example=lambda x, w, b: F.linear(x, w, b),
         inputs={"x": (2, 5, 8), "w": (6, 8), "b": (6,)},
         description="a float32 linear is oneDNN's inner product on the CPU, torch's "
                     "linear elsewhere: the same values, another kernel"),
]
