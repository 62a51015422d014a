#!/usr/bin/env bash
# The main job: installs what it needs into .venv, then runs the demo on the bundled example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m compiler "$@"
