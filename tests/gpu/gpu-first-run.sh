#!/usr/bin/env bash
# The first real-GPU run (issue 2), for the device tool. Build here first:
#   cargo build --release
# then on the device, carrying target/release/libcudapool.so and target/release/cudapool:
#   bash tests/gpu/gpu-first-run.sh            (logs under $OUT, or /tmp/cudapool-gpu)
# Runs: a CUDA runtime program built with static and with shared cudart; the driver-API test
# client reaching the real driver by dlsym, cuGetProcAddress_v2 (with and without per-thread
# streams) and linking; PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1, unlimited and at 1 GiB.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cudapool-gpu}
mkdir -p "$OUT"
LIB=$PWD/target/release/libcudapool.so
W=$(mktemp -d)
exec > >(tee "$OUT/gpu-first-run.log") 2>&1

step() { echo; echo "=== $*"; }
shim() { env LD_PRELOAD="$LIB" CUDAPOOL_REPORT=stderr "$@"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvcc --version | tail -2
python3 -c 'import torch; print("torch", torch.__version__)'

step "build test programs"
nvcc -O2 -cudart static -o "$W/rt_static" tests/gpu/programs/rt_alloc.cu && echo "rt_static built"
nvcc -O2 -cudart shared -o "$W/rt_shared" tests/gpu/programs/rt_alloc.cu && echo "rt_shared built"
cc -O1 -Itests/c -o "$W/client" tests/c/client.c tests/c/reuse.c tests/c/lifetimes.c tests/c/capture.c tests/c/sleep.c -ldl -lpthread && echo "client built"
CUDA_LIB=$(dirname "$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')")
cc -O1 -DLINKED -Itests/c -o "$W/client_linked" tests/c/client.c tests/c/reuse.c tests/c/lifetimes.c tests/c/capture.c tests/c/sleep.c -L"$W" -l:libcuda.so.1 \
  -Wl,-rpath-link,"$CUDA_LIB" -L"$CUDA_LIB" -ldl -lpthread 2>"$W/link.err" && echo "client_linked built" \
  || { echo "client_linked not built:"; head -5 "$W/link.err"; }

for v in static shared; do
  step "runtime program, $v cudart, no limit"
  shim "$W/rt_$v"
  step "runtime program, $v cudart, CUDAPOOL_MEMORY_LIMIT=1GiB"
  shim env CUDAPOOL_MEMORY_LIMIT=1GiB "$W/rt_$v"
done

for mode in dlsym gpa gpa-ptsz link; do
  bin="$W/client"; [ "$mode" = link ] && bin="$W/client_linked"
  [ -x "$bin" ] || continue
  step "driver-API client by $mode: basic"
  shim "$bin" "$mode" basic
  step "driver-API client by $mode: 64 MiB limit, 8 MiB allocations"
  shim env CUDAPOOL_MEMORY_LIMIT=64MiB "$bin" "$mode" limit 8388608
done
step "bad input: the driver's answers without the shim, then the shim's"
"$W/client" gpa bad | grep -v '^after' > "$W/bad.plain"
shim env CUDAPOOL_MEMORY_LIMIT=512MiB "$W/client" gpa bad > "$W/bad.shim"
cat "$W/bad.shim"
if diff <(grep -v '^after\|^getinfo_free_only' "$W/bad.shim") <(grep -v '^getinfo_free_only' "$W/bad.plain"); then
  echo "bad input: every answer identical with and without the shim"
else
  echo "bad input: ANSWERS DIFFER (above)"
fi
step "context teardown"
shim "$W/client" gpa ctx
step "pitch, address range"
shim "$W/client" dlsym pitch
shim "$W/client" dlsym range

step "PyTorch, caching off, no shim: its own error for more memory than the GPU has"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 TORCH_CHECK_BIG_GIB=200 python3 tests/gpu/torch_check.py 2>&1 | grep -i "tensor\|mem_get_info"
step "PyTorch, caching on (its own allocator), no shim: the same"
TORCH_CHECK_BIG_GIB=200 python3 tests/gpu/torch_check.py 2>&1 | grep -i "GiB tensor"
step "PyTorch, caching off, no limit"
shim env PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 tests/gpu/torch_check.py
step "PyTorch, caching off, CUDAPOOL_MEMORY_LIMIT=1GiB"
shim env PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUDAPOOL_MEMORY_LIMIT=1GiB python3 tests/gpu/torch_check.py
for fw in cupy numba jax; do
  step "$fw under the shim, CUDAPOOL_MEMORY_LIMIT=1GiB (oversized request: 2 GiB)"
  shim env CUDAPOOL_MEMORY_LIMIT=1GiB XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout 120 \
    python3 tests/gpu/frameworks_check.py "$fw" 2>&1 | grep -v "^W0000\|^I0000\|Warning\|warn(" | tail -12
done
step "non-CUDA processes under the shim with a bad setting"
LD_PRELOAD="$LIB" CUDAPOOL_MEMORY_LIMIT=bogus /bin/true && echo "/bin/true: exit 0"
LD_PRELOAD="$LIB" CUDAPOOL_MEMORY_LIMIT=bogus python3 -c pass && echo "python3 -c pass: exit 0"
step "the CLI"
target/release/cudapool run --limit 1GiB --report -- "$W/client" dlsym sample
echo; echo "=== done"
