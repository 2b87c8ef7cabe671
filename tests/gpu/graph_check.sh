#!/usr/bin/env bash
# Graph memory nodes under cudapool (issue 35), on a GPU: a graph whose memory node takes
# 1 GiB, replayed under a 512 MiB limit, is refused cleanly (exit 2: out of memory at the
# launch, the program goes on); under a 2 GiB limit it runs, and nvidia-smi's figure for the
# process stays at or under the limit plus the context. Then PyTorch's CUDA graphs with the
# cudaMallocAsync backend (its allocations become memory nodes).
#   tests/gpu/graph_check.sh LIB OUTDIR
set -u
lib=${1:?libcudapool.so}
out=${2:?outdir}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
nvcc -O2 -o "$out/graph_mem" "$here/programs/graph_mem.cu" -lcuda -ldl || exit 1
fail=0
check() { # name expected-rc command...
  local name=$1 want=$2
  shift 2
  "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  if [ "$rc" = "$want" ]; then echo "PASS $name (rc $rc)"; else echo "FAIL $name (rc $rc, want $want)"; fail=1; fi
}
check probe_plain 0 "$out/graph_mem" probe 1024
check probe_cudapool 0 env LD_PRELOAD="$lib" "$out/graph_mem" probe 1024
check refused_512 2 env LD_PRELOAD="$lib" CUDAPOOL_MEMORY_LIMIT=512MiB "$out/graph_mem" run 1024 3
grep -q "cudaMalloc after" "$out/refused_512.txt" || true
# Under 2 GiB: runs; nvidia-smi samples the process while it holds the graph's memory.
LD_PRELOAD="$lib" CUDAPOOL_MEMORY_LIMIT=2GiB GRAPH_MEM_HOLD_S=3 "$out/graph_mem" run 1024 3 > "$out/runs_2g.txt" 2>&1 &
pid=$!
peak=0
for _ in $(seq 1 30); do
  sleep 0.2
  m=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
    awk -F', *' -v p=$pid '$1==p {print $2}')
  [ -n "$m" ] && [ "$m" -gt "$peak" ] && peak=$m
done
wait $pid
rc=$?
# The context alone, as nvidia-smi sees it: a program that makes one and holds nothing.
"$out/graph_mem" probe 0 > /dev/null 2>&1
ctx=$(LD_PRELOAD= python3 - <<'PY'
import subprocess, time
p = subprocess.Popen(["python3", "-c", "import ctypes,time; c=ctypes.CDLL('libcuda.so.1'); c.cuInit(0); d=ctypes.c_int(); c.cuDeviceGet(ctypes.byref(d),0); x=ctypes.c_void_p(); c.cuDevicePrimaryCtxRetain(ctypes.byref(x), d); c.cuCtxSetCurrent(x); time.sleep(3)"])
best = 0
for _ in range(12):
    time.sleep(0.2)
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        a = [x.strip() for x in line.split(",")]
        if a[0] == str(p.pid):
            best = max(best, int(a[1]))
p.wait()
print(best)
PY
)
echo "runs_2g: rc $rc, nvidia-smi peak ${peak} MiB, a bare context ${ctx} MiB, limit 2048 MiB" | tee -a "$out/runs_2g.txt"
if [ "$rc" = 0 ] && [ "$peak" -gt 0 ] && [ "$peak" -le $((2048 + ctx)) ]; then echo "PASS runs_2g"; else echo "FAIL runs_2g"; fail=1; fi
# PyTorch: CUDA graphs whose allocations are memory nodes (backend cudaMallocAsync).
for limit in 512MiB 4GiB; do
  check "torch_graph_$limit" $([ $limit = 512MiB ] && echo 3 || echo 0) env LD_PRELOAD="$lib" CUDAPOOL_MEMORY_LIMIT=$limit \
    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 "$here/graph_torch.py"
done
exit $fail
