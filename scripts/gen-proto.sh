#!/usr/bin/env bash
# Regenerates the Python code of the gputopo.v1 wire contract from proto/gputopo/v1/*.proto.
#
#   scripts/gen-proto.sh [OUT_DIR]
#
# Writes gputopo/v1/*_pb2.py, *_pb2_grpc.py and their .pyi stubs under OUT_DIR (default: the
# repository root, i.e. the committed copy). The generated files are committed so that users and
# CI import them without a code generator; tests/test_proto_fresh.py regenerates into a temporary
# directory and fails when the committed copy is stale. Never edit the generated files by hand.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root}
python=${PYTHON:-$root/.venv/bin/python}
# protoc finds the mypy plugins (protoc-gen-mypy, protoc-gen-mypy_grpc) next to the interpreter.
export PATH="$(dirname "$python"):$PATH"
mkdir -p "$out/gputopo/v1"
cd "$root/proto"
"$python" -m grpc_tools.protoc -I . \
  --python_out="$out" --grpc_python_out="$out" \
  --mypy_out="$out" --mypy_grpc_out="$out" \
  gputopo/v1/*.proto 2> >(grep -v "^Writing mypy to" >&2)
cat > "$out/gputopo/v1/__init__.py" <<'PY'
"""Generated code of the gputopo.v1 wire contract (scripts/gen-proto.sh). Do not edit."""
PY
