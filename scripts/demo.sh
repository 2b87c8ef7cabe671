#!/usr/bin/env bash
# The main job: build cudapool, then run the bundled sample workload under it with a limit and
# the exit report. With a GPU (nvidia-smi works and libcuda.so.1 is installed) the sample runs
# against the real driver; without one, against the fake driver in tests/fake (host memory,
# 1 GiB per device). LIMIT=... overrides the limit (default 512MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release
work=target/demo
mkdir -p "$work"
cc -O1 -Itests/c -o "$work/sample" tests/c/client.c tests/c/reuse.c tests/c/lifetimes.c -ldl -lpthread
if nvidia-smi -L >/dev/null 2>&1 && ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  echo "GPU found: the sample runs against the real driver"
else
  bash scripts/fake-driver.sh "$work"
  export LD_LIBRARY_PATH="$PWD/$work${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "no GPU found: the sample runs against the fake driver (host memory, 1 GiB per device)"
fi
limit=${LIMIT:-512MiB}
echo "\$ cudapool run --limit $limit --report -- sample"
exec target/release/cudapool run --limit "$limit" --report -- "$work/sample" dlsym sample
