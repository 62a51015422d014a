"""Test options (``--soak N`` runs N times more random instances per rule, default 1) and
shared fixtures."""

import io
import os

import pytest

# The Triton tests run every kernel in Triton's interpreter (the CPU has no GPU); the mode is
# read when a kernel is decorated, so it is set before any test module imports triton.
os.environ["TRITON_INTERPRET"] = "1"
# The default cost model prices with the shipped CPU profile, not this machine's
# calibration, so that the programs the tests expect do not depend on the machine (or on
# its load while it calibrates); tests/test_calibration.py tests calibration itself.
os.environ.setdefault("EGRAPH_CALIBRATION", "builtin")


def pytest_addoption(parser):
    parser.addoption("--soak", type=int, default=None,
                     help="multiply the random instances per rule (100 in CI) by N")


def pytest_configure(config):
    soak = config.getoption("--soak")
    if soak:
        os.environ["EGRAPH_SOAK"] = str(soak)


@pytest.fixture
def saved_and_loaded():
    """``torch.save`` a module and ``torch.load`` it back, as a user keeps an optimised
    module (loading makes torch.fx trace a GraphModule's code again)."""
    import torch

    def round_trip(module):
        buffer = io.BytesIO()
        torch.save(module, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)
    return round_trip
