#!/usr/bin/env bash
# The test suite: installs what it needs into .venv, then runs pytest (doctests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh dev corpus plot
exec .venv/bin/python -m pytest "$@"
