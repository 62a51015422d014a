#!/usr/bin/env bash
# The test suite: installs what it needs into .venv, then runs pytest (doctests included) on
# every core, the tests handed out to workers as each finishes (pytest-xdist; "-n 0" for one
# process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh dev corpus plot
exec .venv/bin/python -m pytest -n auto --dist worksteal "$@"
