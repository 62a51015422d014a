"""Test options: ``--soak N`` runs N times more random instances per rule (default 1)."""

import os

# The Triton tests run every kernel in Triton's interpreter (the CPU has no GPU); the mode is
# read when a kernel is decorated, so it is set before any test module imports triton.
os.environ["TRITON_INTERPRET"] = "1"


def pytest_addoption(parser):
    parser.addoption("--soak", type=int, default=None,
                     help="multiply the random instances per rule (100 in CI) by N")


def pytest_configure(config):
    soak = config.getoption("--soak")
    if soak:
        os.environ["EGRAPH_SOAK"] = str(soak)
