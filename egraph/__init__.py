"""A pure-Python equality-saturation engine (egg's design), with a PyTorch front and back end.

``import egraph`` never imports torch. The engine alone:

>>> from egraph import EGraph, ConstantFolding, rewrite, parse, AstSize
>>> eg = EGraph(analysis=ConstantFolding())
>>> a = eg.add(parse("(* (+ x 0) 1)"), root=True)
>>> rules = [rewrite("zero-add", "(+ ?a 0)", "?a"), rewrite("one-mul", "(* ?a 1)", "?a")]
>>> eg.saturate(rules).extract(AstSize(), root=a)
(Term('x'), 1)
"""

from egraph.analysis import Analysis, ConstantFolding
from egraph.diagnose import Diagnosis, diagnose
from egraph.egraph import EGraph, ENode, UnsoundMerge
from egraph.explain import Explanation
from egraph.extract import AstDepth, AstSize
from egraph.logs import set_logs
from egraph.pattern import Pattern, Subst
from egraph.rewrite import Rewrite, birewrite, rewrite
from egraph.run import BackoffScheduler, Report, Runner, SimpleScheduler
from egraph.term import Term, Var, parse, vars

__all__ = [
    "Analysis",
    "AstDepth",
    "AstSize",
    "BackoffScheduler",
    "ConstantFolding",
    "Diagnosis",
    "EGraph",
    "ENode",
    "Explanation",
    "Pattern",
    "Report",
    "Rewrite",
    "Runner",
    "SimpleScheduler",
    "Subst",
    "Term",
    "UnsoundMerge",
    "Var",
    "birewrite",
    "diagnose",
    "parse",
    "rewrite",
    "set_logs",
    "vars",
]
