"""torch.fx ingest: graphs, modules and torch.export programs become e-graphs."""

from frontends.fx.analysis import Meta, TensorAnalysis
from frontends.fx.exported import ExportedModule
from frontends.fx.ingest import from_fx
from frontends.fx.mismatch import InputMismatch
from frontends.fx.source import FxSource
from frontends.fx.tracing import UntraceableModel, trace

__all__ = ["ExportedModule", "FxSource", "InputMismatch", "Meta", "TensorAnalysis",
           "UntraceableModel", "from_fx", "trace"]
