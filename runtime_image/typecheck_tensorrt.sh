#!/usr/bin/env bash
# Type-check the TensorRT backend against tensorrt-stubs (installed by `pip install -e '.[dev]'`).
# The stubs ship without py.typed and with parameters named `in` and a non-default parameter after a
# default one, which are syntax errors; check against a patched copy of them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$site/tensorrt" "$site/tensorrt_bindings" "$tmp/"
sed -i -E 's/([(,] ?)in: /\1in_: /g; s/power: Weights = None, channel_axis: int\)/power: Weights = None, channel_axis: int = ...)/' \
  "$tmp/tensorrt_bindings/tensorrt.pyi"
out=$(MYPYPATH="$tmp" "$PY" -m mypy --follow-untyped-imports runtime_image/trtforge_runtime/backends/tensorrt_backend.py 2>&1 || true)
errors=$(grep '^runtime_image/' <<<"$out" || true)
if [ -n "$errors" ]; then echo "$errors"; exit 1; fi
echo "tensorrt_backend.py: no type errors against tensorrt-stubs"
