#!/usr/bin/env bash
# How long `cudapool exporter` takes to answer a scrape of N cudapool processes (issue 24; no
# GPU: the processes are the C test client against the fake driver, each holding a block).
#   bash scripts/bench-exporter.sh [N]     (default 100; prints the median of 50 scrapes, ms)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
n=${1:-100}
cargo build --release -q
W=target/bench-exporter
mkdir -p "$W"
cc -O1 -shared -fPIC -Wl,-Bsymbolic -o "$W/libcuda.so.1" tests/fake/libcuda.c -lpthread
cc -O1 -Itests/c -o "$W/client" tests/c/client.c tests/c/reuse.c tests/c/lifetimes.c tests/c/capture.c tests/c/sleep.c -ldl -lpthread
export LD_LIBRARY_PATH="$PWD/$W"
# Every client reads this FIFO, which only this script holds open for writing: they all exit
# (freeing their block) when the script does. No child inherits the script's descriptor 3 (a
# client holding a writer of its own FIFO would wait for its end forever).
fifo="$W/hold"
rm -f "$fifo"
mkfifo "$fifo"
exec 3<>"$fifo"
pids=()
for _ in $(seq "$n"); do
  LD_PRELOAD="$PWD/target/release/libcudapool.so" "$W/client" dlsym park 1 1048576 <"$fifo" >/dev/null 3>&- &
  pids+=($!)
done
target/release/cudapool exporter --listen 127.0.0.1:0 --interval 0 2>"$W/exporter.err" 3>&- &
exp=$!
trap 'kill $exp 2>/dev/null; exec 3>&-; wait "${pids[@]}" 2>/dev/null; rm -f "$fifo"' EXIT
url=""
for _ in $(seq 50); do
  url=$(grep -o 'http://[0-9.:]*/metrics' "$W/exporter.err" || true)
  [ -n "$url" ] && break
  sleep 0.1
done
python3 - "$url" "$n" 3>&- <<'PY'
import statistics, sys, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 20
while True:  # until every client has published
    body = urllib.request.urlopen(url).read().decode()
    seen = sum(1 for l in body.splitlines() if l.startswith("cudapool_allocated_bytes{"))
    if seen >= n or time.monotonic() > deadline:
        break
    time.sleep(0.2)
times = []
for _ in range(50):
    t = time.perf_counter()
    body = urllib.request.urlopen(url).read()
    times.append((time.perf_counter() - t) * 1000)
print(f"exporter: {seen} processes, {len(body)} bytes a scrape; ms per scrape: median {statistics.median(times):.1f}, min {min(times):.1f}, max {max(times):.1f}")
PY
