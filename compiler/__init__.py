"""The torch pipeline, at the top of the data flow.

Everything here uses the layers below it (the engine ``egraph``, the front end ``frontends``,
the cost models ``extractors`` and the emitters ``backends``) and nothing below imports it,
save ``EGraph.from_fx``, which reaches up lazily so that ``import egraph`` stays torch-free.

- :mod:`compiler.stability`: the numerical-stability rewriter and its error measurements.
- :mod:`compiler.soundness`: soundness testing of rules (random instances, float64
  references, sympy proofs).

>>> import compiler.soundness, compiler.stability
"""
