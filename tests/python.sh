#!/usr/bin/env bash
# The Python tests: clients/python against a live `engine serve` (the real openenv-core client,
# `openenv validate`, the Gymnasium checker). Makes (or reuses) a virtual environment with
# openenv-core, gymnasium, pytest and the package, builds the engine binary, runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"
venv="${ENVFACTORY_PY_VENV:-$target/py-venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# Reinstalled when the package's own description (its dependencies) changes, or when the
# virtual environment was made for another checkout (the package is installed editable, from
# this checkout's clients/python: a venv shared by two clones would test the other's code).
stamp="$venv/.envfactory-stamp"
want="$( (sha256sum clients/python/pyproject.toml "$0"; echo "$PWD") | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] ||
  ! "$venv/bin/python" -c 'import openenv, gymnasium, pytest, envfactory' 2>/dev/null; then
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "openenv-core>=0.3,<0.4" "gymnasium>=1.0" pytest
  "$venv/bin/pip" install -q -e clients/python
  echo "$want" > "$stamp"
fi
cargo build -q --bin engine --bin engine-core --bin envfactory-init
export CARGO_TARGET_DIR="$target"
exec "$venv/bin/python" -m pytest -q clients/python/tests "$@"
