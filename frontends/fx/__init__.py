"""torch.fx ingest: graphs, modules and torch.export programs become e-graphs."""

from frontends.fx.analysis import Meta, TensorAnalysis
from frontends.fx.exported import ExportedModule
from frontends.fx.ingest import FxSource, InputMismatch, UntraceableModel, from_fx, trace

__all__ = ["ExportedModule", "FxSource", "InputMismatch", "Meta", "TensorAnalysis",
           "UntraceableModel", "from_fx", "trace"]
