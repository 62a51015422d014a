"""benchmarks/memory.py on the corpus's tiny GPT-2: every row's gradients are eager's, and
the egraph backend's budgeted rows keep less for the backward than Inductor's partition."""

from __future__ import annotations

import pytest
import torch

memory = pytest.importorskip("benchmarks.memory")
pytest.importorskip("transformers")


def test_budgeted_rows_keep_less_with_eagers_gradients():
    torch._dynamo.reset()
    torch._inductor.config.fx_graph_cache = False
    model, inputs = memory.training_model("gpt2", 2, 32, tiny=True)
    chosen = ["eager", "Inductor", "egraph budget 0.5", "egraph + Inductor budget 0.25"]
    rows = {r["system"]: r for r in memory.measure(model, inputs, chosen, rounds=1)}
    assert set(rows) == set(chosen)
    for row in rows.values():
        assert row["grad error"] < 1e-4, row
        assert row["saved MiB"] > 0 and row["peak MiB"] >= row["saved MiB"]
    # (a budgeted row gives the recomputation its partition estimates for the budget)
    assert rows["egraph budget 0.5"]["recompute est. ms"] > 0
    assert rows["Inductor"]["recompute est. ms"] == ""
    inductor = rows["Inductor"]["saved MiB"]
    assert rows["egraph budget 0.5"]["saved MiB"] < inductor
    assert rows["egraph + Inductor budget 0.25"]["saved MiB"] < 0.8 * inductor
