#!/usr/bin/env bash
# NVML under cudapool on a GPU (issue 35): nvidia-smi and pynvml see the budget. Prints each
# check's output and a PASS/FAIL line; "nvml: N passed, M failed" last. Needs
# target/release/libcudapool.so and target/release/cudapool (carried), nvidia-smi, python3
# with pynvml (nvidia-ml-py) and torch.
set -uo pipefail
cd "$(dirname "$0")/../.."
CLI=$PWD/target/release/cudapool
export CUDAPOOL_RUNTIME_DIR=${CUDAPOOL_RUNTIME_DIR:-/tmp/cudapool-nvml-check-$$}
pass=0 fail=0
result() { if [ "$1" = PASS ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi; echo "$1 $2"; }
# The GPU this half runs on, as nvidia-smi names it (the first of CUDA_VISIBLE_DEVICES).
GPU=${CUDA_VISIBLE_DEVICES:-0}; GPU=${GPU%%,*}
q() { nvidia-smi --query-gpu=memory.total,memory.used,memory.free --format=csv,noheader,nounits -i "$GPU"; }
echo "=== nvidia-smi, no cudapool"; plain=$(q); echo "$plain"
echo "=== ldd nvidia-smi"; ldd "$(command -v nvidia-smi)" 2>&1 | head -5
echo "=== nvidia-smi under cudapool run --limit 8GiB"; lim=$("$CLI" run --limit 8GiB -- nvidia-smi --query-gpu=memory.total,memory.used,memory.free --format=csv,noheader,nounits -i "$GPU"); echo "$lim"
total=$(echo "$lim" | cut -d, -f1 | tr -d ' ')
[ "$total" = 8192 ] && result PASS "nvidia-smi under an 8 GiB limit shows 8192 MiB total ($lim)" || result FAIL "nvidia-smi under an 8 GiB limit: $lim"
echo "=== nvidia-smi (full view) under the limit"; "$CLI" run --limit 8GiB -- nvidia-smi | head -20
echo "=== pynvml under the limit, a process holding 2 GiB through torch (caching off)"
out=$(PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$CLI" run --limit 8GiB -- python3 -c '
import torch, pynvml
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
pynvml.nvmlInit()
# NVML numbers GPUs its own way (not CUDA_VISIBLE_DEVICES'): the GPU torch uses, by its UUID.
h = pynvml.nvmlDeviceGetHandleByUUID("GPU-" + str(torch.cuda.get_device_properties(0).uuid))
m = pynvml.nvmlDeviceGetMemoryInfo(h)
try:
    m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    v2 = (m2.total, m2.reserved, m2.used, m2.free)
except Exception as e:
    v2 = repr(e)
free, total = torch.cuda.mem_get_info()
print("pynvml", m.total, m.used, m.free, "v2", v2, "cuMemGetInfo", total, free)
' 2>&1); echo "$out"
read -r _ t u f _ <<< "$(echo "$out" | grep '^pynvml')"
if [ "${t:-0}" = $((8 << 30)) ] && [ "${u:-0}" -ge $((2 << 30)) ] && [ "${f:-1}" -le $((6 << 30)) ]; then
  result PASS "pynvml: total 8 GiB, used >= 2 GiB, free <= the room left ($t $u $f)"
else
  result FAIL "pynvml: $t $u $f"
fi
echo "=== a group: a member holds 4 GiB; another process of the group runs nvidia-smi"
export CUDAPOOL_GROUP=nvml-check-$$ CUDAPOOL_GROUP_LIMIT=12GiB
PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$CLI" run -- python3 -c '
import sys, time, torch
x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
print("held", flush=True); time.sleep(20)' > /tmp/nvml-holder.$$ 2>&1 &
holder=$!
for _ in $(seq 100); do grep -q held /tmp/nvml-holder.$$ && break; sleep 0.2; done
g=$("$CLI" run -- nvidia-smi --query-gpu=memory.total,memory.used,memory.free --format=csv,noheader,nounits -i "$GPU"); echo "$g"
"$CLI" stat | tail -3
kill $holder 2>/dev/null; wait $holder 2>/dev/null
gt=$(echo "$g" | cut -d, -f1 | tr -d ' '); gu=$(echo "$g" | cut -d, -f2 | tr -d ' ')
[ "$gt" = 12288 ] && [ "${gu:-0}" -ge 4096 ] && result PASS "a group's nvidia-smi: 12288 MiB total, ${gu} MiB used by the group" || result FAIL "a group's nvidia-smi: $g"
unset CUDAPOOL_GROUP CUDAPOOL_GROUP_LIMIT
echo "nvml: $pass passed, $fail failed"
