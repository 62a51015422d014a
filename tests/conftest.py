"""Test options: ``--soak N`` runs N times more random instances per rule (default 1)."""

import os


def pytest_addoption(parser):
    parser.addoption("--soak", type=int, default=None,
                     help="multiply the random instances per rule (100 in CI) by N")


def pytest_configure(config):
    soak = config.getoption("--soak")
    if soak:
        os.environ["EGRAPH_SOAK"] = str(soak)
