"""torch.fx ingest: graphs, modules and torch.export programs become e-graphs."""

from frontends.fx.analysis import Meta, TensorAnalysis
from frontends.fx.ingest import FxSource, UntraceableModel, from_fx, trace

__all__ = ["FxSource", "Meta", "TensorAnalysis", "UntraceableModel", "from_fx", "trace"]
