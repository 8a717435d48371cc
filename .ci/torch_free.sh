#!/usr/bin/env bash
# The torch-free install in a fresh virtual environment: build the wheel, install it with the
# `text` extra, and run exports made by the full install there (see torch_free.py).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip wheel --quiet --no-deps --no-build-isolation -w "$work/dist" .
python3 .ci/torch_free.py prepare "$work/exports"
python3 -m venv "$work/venv"
wheel=$(ls "$work"/dist/edgeattn-*.whl)
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel[text]"
(cd "$work" && PATH="$work/venv/bin:$PATH" "$work/venv/bin/python" "$OLDPWD/.ci/torch_free.py" check "$work/exports")
echo "venv on disk: $(du -sh "$work/venv" | cut -f1)"
