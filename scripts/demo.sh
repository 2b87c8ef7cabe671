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
cc -O1 -Itests/c -o "$work/client" tests/c/client.c tests/c/reuse.c tests/c/lifetimes.c tests/c/capture.c tests/c/sleep.c -ldl -lpthread
# target/demo/sample: the sample workload, to run yourself (`cudapool run --limit 256MiB --
# target/demo/sample`); it uses the fake driver beside it when there is one.
cat > "$work/sample" <<'SH'
#!/bin/sh
# The demo's sample workload (tests/c/client.c, scenario "sample"): allocates 64 MiB buffers
# until refused. Without a GPU it uses the fake driver scripts/demo.sh laid out beside it.
dir=$(cd "$(dirname "$0")" && pwd)
[ -f "$dir/libcuda.so.1" ] && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$dir/client" dlsym sample "$@"
SH
chmod +x "$work/sample"
if nvidia-smi -L >/dev/null 2>&1 && ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  echo "GPU found: the sample runs against the real driver"
else
  bash scripts/fake-driver.sh "$work"
  export LD_LIBRARY_PATH="$PWD/$work${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "no GPU found: the sample runs against the fake driver (host memory, 1 GiB per device)"
fi
limit=${LIMIT:-512MiB}
echo "\$ cudapool run --limit $limit --report -- $work/sample"
exec target/release/cudapool run --limit "$limit" --report -- "$work/sample"
