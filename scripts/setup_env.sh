#!/usr/bin/env bash
# Creates .venv with the pinned dependencies (torch pinned to the CPU wheel: no CUDA download).
# Usage: bash scripts/setup_env.sh [extra ...]   extras: dev (tests), bench (peer engines)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=".venv/.installed-$(sha1sum pyproject.toml scripts/setup_env.sh | sha1sum | cut -c1-12)-${*:-base}"
if [ ! -f "$stamp" ]; then
  extras=$(IFS=,; echo "$*")
  .venv/bin/pip install -q --disable-pip-version-check "torch==2.13.0"
  .venv/bin/pip install -q --disable-pip-version-check -e ".${extras:+[$extras]}"
  touch "$stamp"
fi
