#!/usr/bin/env bash
# Fetches the peers' own memory tests at the versions the GPU machine runs, into .peers/ (not
# committed; carry it to the GPU machine): PyTorch's test/test_cuda.py and the test files it
# imports from test/, at the tag of the installed PyTorch, and CuPy's
# tests/cupy_tests/cuda_tests/test_memory.py at the tag of the installed CuPy.
# tests/gpu/peers/peers.sh runs them with and without cudapool.
#   bash scripts/fetch-peer-tests.sh [TORCH_VERSION [CUPY_VERSION]]
# (default: the versions python3 here imports; give them when the GPU machine's differ).
set -euo pipefail
cd "$(dirname "$0")/.."
version() { python3 -c "import $1, sys; sys.stdout.write($1.__version__.split('+')[0])" 2>/dev/null; }
torch_v=${1:-$(version torch || true)}
cupy_v=${2:-$(version cupy || true)}
[ -n "$torch_v" ] || { echo "fetch-peer-tests: name PyTorch's version (no torch here)" >&2; exit 2; }
[ -n "$cupy_v" ] || { echo "fetch-peer-tests: name CuPy's version (no cupy here)" >&2; exit 2; }
fetch() { # repository, tag, path, destination
  python3 - "$1" "$2" "$3" "$4" <<'PY'
import os, sys, urllib.request
repo, tag, path, dest = sys.argv[1:]
url = f"https://raw.githubusercontent.com/{repo}/{tag}/{path}"
with urllib.request.urlopen(url, timeout=60) as r:
    data = r.read()
os.makedirs(os.path.dirname(dest), exist_ok=True)
with open(dest + ".part", "wb") as f:
    f.write(data)
os.replace(dest + ".part", dest)
print(f"{dest}: {len(data)} bytes from {repo}@{tag}")
PY
}
rm -rf .peers
fetch pytorch/pytorch "v$torch_v" test/test_cuda.py .peers/torch/test_cuda.py
# test_cuda.py imports helpers that live beside it in test/ (when it does).
for helper in $(sed -n 's/^from \(test_[a-z_]*\) import.*/\1/p; s/^import \(test_[a-z_]*\)$/\1/p' .peers/torch/test_cuda.py | sort -u); do
  fetch pytorch/pytorch "v$torch_v" "test/$helper.py" ".peers/torch/$helper.py" || true
done
# PyTorch's test helpers (torch.testing._internal) import expecttest, which a PyTorch install
# need not have: beside test_cuda.py, pytest's path finds it there.
fetch pytorch/expecttest "v${EXPECTTEST_VERSION:-0.3.0}" expecttest/__init__.py .peers/torch/expecttest/__init__.py ||
  echo "fetch-peer-tests: expecttest not fetched: the GPU machine needs it installed (pip install expecttest)" >&2
fetch cupy/cupy "v$cupy_v" tests/cupy_tests/cuda_tests/test_memory.py .peers/cupy/test_memory.py
echo "$torch_v $cupy_v" > .peers/VERSIONS
