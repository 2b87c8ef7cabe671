#!/usr/bin/env bash
# The GPU suite: real programs and frameworks under cudapool, limits checked from outside with
# nvidia-smi (docs/gpu-suite.md). Build first (cargo build --release), then on the GPU machine,
# from the repository root:
#   bash scripts/gpu-check.sh              (log and results under $OUT)
# On a machine with two GPUs it adds the multi-device tests. With NVIDIA's CUDA
# samples fetched (scripts/fetch-samples.sh; carry .samples) it runs them with and without
# cudapool (SKIP_SAMPLES=1 leaves them out; tests/gpu/samples.sh runs them alone). Ends with a table
# of PASS/FAIL lines and "N passed, M failed"; exits 1 if anything failed.
#
# "Holds from outside": a process's peak GPU memory as nvidia-smi reports it stays at or under
# the limit plus that program's own overhead (context, loaded kernels, library handles), which
# is measured once without the shim by the same program with everything freed ("idle").
set -u
cd "$(dirname "$0")/.."
# Without a GPU (or its tools) there is nothing to check: say so, run nothing.
for tool in nvidia-smi nvcc; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "gpu-check: no $tool on PATH: this suite needs an NVIDIA GPU with its driver and the CUDA toolkit; run scripts/test.sh for everything that needs none" >&2
    exit 2
  }
done
nvidia-smi -L >/dev/null 2>&1 || { echo "gpu-check: nvidia-smi finds no GPU: nothing to check" >&2; exit 2; }
[ -f target/release/libcudapool.so ] || { echo "gpu-check: no target/release/libcudapool.so: run cargo build --release first" >&2; exit 2; }
OUT=${OUT:-/tmp/cudapool-gpu-check}
# GPU_TIER=quick: the checks every change of the library passes (build, races, the hand-over,
# graphs, capture, giving back, the peers' memory tests, sleep of 4 GiB); full (the default):
# everything; rest: everything the quick tier leaves out (sleep of 20 GiB included), so that
# the full suite runs as two halves (quick, then rest: on two GPUs at once, or one after the
# other where one run has a time limit). The peers' tests need .peers
# (scripts/fetch-peer-tests.sh).
TIER=${GPU_TIER:-full}
case $TIER in quick | rest | full) ;; *) echo "gpu-check: GPU_TIER is quick, rest or full, not $TIER" >&2; exit 2 ;; esac
# The sections only the full suite runs (full and rest).
full() { [ "$TIER" != quick ]; }
# The quick tier's sections are functions: the full suite runs each where it stands, the quick
# tier side by side in lanes (below), then those that read the whole device's memory alone.
in_place() { [ "$TIER" = full ]; }
SLEEP_GIB=20
[ "$TIER" = quick ] && SLEEP_GIB=4
mkdir -p "$OUT"
LIB=$PWD/target/release/libcudapool.so
W=$(mktemp -d)
exec > >(tee "$OUT/gpu-check.log") 2>&1
RESULTS="$OUT/results.txt"
: > "$RESULTS"
START=$SECONDS

. tests/gpu/checks.sh
shim() { env LD_PRELOAD="$LIB" $T "$@"; }
# Every program runs under a time limit: a hang is a failure, not the end of the suite.
T="timeout 120"
# A section's title, with the seconds since the start (where the suite's time goes).
section() { echo "=== [$((SECONDS - START)) s] $*"; }
field() { # key, file: the value of key=... in the file's first line holding it
  sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p" "$2" | head -1
}

# A process and all its descendants (the program may run under env, timeout, a subshell).
family() {
  local p
  echo "$1"
  for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do family "$p"; done
}

# Runs a command in the background (killed after 120 s), sampling the GPU memory of its process
# family with nvidia-smi until it exits. Output goes to $1. Sets RC, PEAK (MiB) and HELD (the
# most of its last 5 samples: what it held at the end, before exiting).
watched() {
  local out=$1; shift
  "$@" > "$out" 2>&1 &
  local pid=$! v recent="" deadline=$((SECONDS + 120))
  PEAK=0 HELD=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ $SECONDS -gt $deadline ]; then
      echo "timed out: $*" >> "$out"
      kill -9 $(family "$pid") 2>/dev/null
      break
    fi
    v=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
      awk -F', *' -v ps=" $(family "$pid" | tr '\n' ' ') " 'index(ps, " " $1 " ") { s += $2 } END { if (s) print s }')
    if [ -n "$v" ]; then
      [ "$v" -gt "$PEAK" ] && PEAK=$v
      recent="$(echo "$recent $v" | awk '{ for (i = NF - 4; i <= NF; i++) if (i > 0) printf "%s ", $i }')"
    fi
    sleep 0.1
  done
  wait "$pid"
  RC=$?
  HELD=$(echo "$recent" | awk '{ m = 0; for (i = 1; i <= NF; i++) if ($i > m) m = $i; print m }')
}

section "device"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
# The GPUs this run sees: CUDA_VISIBLE_DEVICES's, where it is set (a half of the suite on one GPU
# of two runs no two-device check), else every GPU nvidia-smi lists.
NGPU=$(nvidia-smi -L | wc -l)
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  seen=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
  [ "$seen" -lt "$NGPU" ] && NGPU=$seen
fi
nvcc --version | tail -1
python3 - <<'PY'
import importlib
for m in ("torch", "cupy", "jax", "numba"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:  # noqa: BLE001
        print(m, "unavailable:", e)
PY

# NVIDIA's samples run beside the rest (their own process, their rows merged at the end): the
# suite then fits in about half the time. The quick tier leaves them out.
SAMPLES_PID=
if full && [ -z "${SKIP_SAMPLES:-}" ] && [ -d .samples/src/Samples ]; then
  : > "$W/samples.results"
  RESULTS="$W/samples.results" OUT="$OUT" LIB="$LIB" bash tests/gpu/samples.sh > "$W/samples.log" 2>&1 &
  SAMPLES_PID=$!
fi

section "build"
# (Waits name their jobs: a bare `wait` would also wait for the log's tee.)
jobs_=()
nvcc -O2 -cudart static -o "$W/rt_static" tests/gpu/programs/rt_alloc.cu & jobs_+=($!)
nvcc -O2 -cudart shared -o "$W/rt_shared" tests/gpu/programs/rt_alloc.cu & jobs_+=($!)
nvcc -O2 -std=c++17 -o "$W/race" tests/gpu/programs/race.cu & jobs_+=($!)
nvcc -O2 -std=c++17 --default-stream per-thread -o "$W/race_ptds" tests/gpu/programs/race.cu & jobs_+=($!)
nvcc -O2 -std=c++17 -o "$W/limit_apis" tests/gpu/programs/limit_apis.cu -lcuda & jobs_+=($!)
nvcc -O2 -std=c++17 -o "$W/capture_threads" tests/gpu/programs/capture_threads.cu -ldl & jobs_+=($!)
nvcc -O2 -o "$W/capture_rules" tests/gpu/programs/capture_rules.cu -lcuda -ldl -lpthread & jobs_+=($!)
nvcc -O2 -std=c++17 -Iinclude -o "$W/load_beside" tests/gpu/programs/load_beside.cu -lcuda -ldl & jobs_+=($!)
nvcc -fatbin -arch=native -o "$W/big_globals.fatbin" tests/gpu/programs/big_globals.cu & jobs_+=($!)
if [ "$NGPU" -ge 2 ]; then nvcc -O2 -std=c++17 -o "$W/multi" tests/gpu/programs/multi.cu & jobs_+=($!); fi
wait "${jobs_[@]}"
ls "$W"

q_basics() {
section "CUDA runtime programs (static and shared cudart)"
for v in static shared; do
  shim "$W/rt_$v" > "$W/rt.out" 2>&1
  check "[ $? = 0 ] && grep -q 'checksum ok' '$W/rt.out'" "runtime program, $v cudart, no limit" "$(grep checksum "$W/rt.out")"
  shim env CUDAPOOL_MEMORY_LIMIT=1GiB "$W/rt_$v" > "$W/rt.out" 2>&1
  total=$(sed -n 's/.*total=\([0-9]*\).*/\1/p' "$W/rt.out")
  check "grep -q 'checksum ok' '$W/rt.out' && grep -q '2 GiB) -> cudaErrorMemoryAllocation' '$W/rt.out' && [ '$total' = 1024 ]" \
    "runtime program, $v cudart, 1 GiB limit" "cudaMemGetInfo total=${total} MiB; $(grep '2 GiB' "$W/rt.out")"
done

section "stream race tests: a kernel still reads a freed block while it is reused"
for mode in legacy blocking nonblocking threads late handoff switch return; do
  bin="$W/race"
  case $mode in threads | handoff) bin="$W/race_ptds" ;; esac
  for k in split binned simple; do
    shim env CUDAPOOL_POOL=$k "$bin" $mode > "$W/race.out" 2>&1
    check "[ $? = 0 ] && grep -q 'checksum ok' '$W/race.out'" "race $mode, $k" "$(tail -1 "$W/race.out")"
  done
done

section "the hand-over: with two queues busy, a fenced block is reused in stream order, no host wait"
# The debug log names each fence handed over and each queue's wait for it; the race must also
# stay intact. One-queue modes (legacy, late, switch, return) reuse without a fence: not here.
# The programs free a few blocks once: kept until pressure (CUDAPOOL_CACHE_IDLE=never), so that
# their reuse, not a release, is what runs.
for mode in blocking nonblocking threads handoff; do
  bin="$W/race"
  case $mode in threads | handoff) bin="$W/race_ptds" ;; esac
  for seg in classic expandable; do
    shim env CUDAPOOL_POOL=split CUDAPOOL_SEGMENTS=$seg CUDAPOOL_LOG=debug CUDAPOOL_CACHE_IDLE=never "$bin" $mode > "$W/race.out" 2>&1
    rc=$?
    handed=$(grep -c 'handed over' "$W/race.out")
    device=$(grep -c 'handed-over fence (on the device)' "$W/race.out")
    host=$(grep -c 'handed-over fence (on the host' "$W/race.out")
    check "[ $rc = 0 ] && grep -q 'checksum ok' '$W/race.out' && [ $handed -ge 1 ] && [ $device -ge 1 ] && [ $host = 0 ]" \
      "hand-over $mode, split $seg" "fences handed over $handed, device waits $device, host waits $host; $(grep -v '^cudapool:' "$W/race.out" | tail -1)"
  done
done

# A module load is charged what the process took (NVML's count of it), not what the device's
# free memory fell by: a neighbour allocating and freeing 256 MiB blocks beside 40 loads of a
# module with 64 MiB of globals. (OLD_LIB: the same beside an earlier build, for the record.)
for side in ${OLD_LIB:+old} new; do
  lib=$LIB; [ $side = old ] && lib=$OLD_LIB
  $T "$W/load_beside" neighbour 20 > "$W/neighbour.out" 2>&1 &
  nb=$!
  sleep 1
  # NVML names processes by the host's pids: in a container of its own pid namespace it lists
  # none of this run's, and cudapool measures by the free memory (docs/design.md says so).
  listed=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ' |
    grep -cxF -f <(family "$nb"))
  listed=${listed:-0}
  env LD_PRELOAD="$lib" CUDA_MODULE_LOADING=EAGER $T "$W/load_beside" load "$W/big_globals.fatbin" 40 > "$W/load_beside.$side.out" 2>&1
  rc=$?
  kill "$nb" 2>/dev/null; wait "$nb" 2>/dev/null
  grep -v '^load [0-9]' "$W/load_beside.$side.out"
  grep '^load [0-9]' "$W/load_beside.$side.out" | awk '{print $3}' | sort | uniq -c | sort -rn | head -5
  if [ $side = new ] && [ "$listed" = 0 ]; then
    result SKIP "a module load beside a busy neighbour is charged what it took" \
      "NVML lists no process of this run (another pid namespace): loads are measured by the free memory here"
  elif [ $side = new ]; then
    check "[ $rc = 0 ] && grep -q '^loads 40 exact=40 ' '$W/load_beside.new.out'" "a module load beside a busy neighbour is charged what it took" \
      "$(tail -1 "$W/load_beside.new.out")$([ -n "${OLD_LIB:-}" ] && echo "; the earlier build: $(tail -1 "$W/load_beside.old.out")")"
  fi
done
}
in_place && q_basics

r_limits() {
section "every allocation API against a 1 GiB limit, seen by nvidia-smi"
watched "$W/idle.out" "$W/limit_apis" idle
OVH_C=$PEAK
echo "CUDA program overhead (no shim, nothing allocated): $OVH_C MiB"
for api in malloc async frompool managed pitch vmm array mipmap; do
  watched "$W/api.out" shim env CUDAPOOL_MEMORY_LIMIT=1GiB "$W/limit_apis" $api
  g=$(field granted_mib "$W/api.out")
  e=$(field error "$W/api.out")
  check "[ $RC = 0 ] && [ '${g:-0}' -le 1024 ] && [ '${g:-0}' -ge 768 ] && [ $PEAK -le $((1024 + OVH_C)) ] && [ '$e' != none ]" \
    "limit 1 GiB through $api" "granted ${g:-?} MiB, refused with $e; nvidia-smi peak $PEAK MiB <= $((1024 + OVH_C))"
done
watched "$W/api.out" "$W/limit_apis" async 128 12
echo "(without the shim, cudaMallocAsync takes $(field granted_mib "$W/api.out") MiB: peak $PEAK MiB)"

}
in_place && r_limits

r_two() {
section "two processes sharing the GPU with different limits"
(watched "$W/two1.out" shim env CUDAPOOL_MEMORY_LIMIT=1GiB "$W/limit_apis" malloc; echo "$PEAK" > "$W/two1.peak") &
t1=$!
(watched "$W/two2.out" shim env CUDAPOOL_MEMORY_LIMIT=3GiB "$W/limit_apis" malloc; echo "$PEAK" > "$W/two2.peak") &
t2=$!
wait $t1 $t2
g1=$(field granted_mib "$W/two1.out") g2=$(field granted_mib "$W/two2.out")
p1=$(cat "$W/two1.peak") p2=$(cat "$W/two2.peak")
check "[ '$g1' = 1024 ] && [ '$g2' = 3072 ] && [ $p1 -le $((1024 + OVH_C)) ] && [ $p2 -le $((3072 + OVH_C)) ]" \
  "two processes, 1 GiB and 3 GiB" "granted $g1 and $g2 MiB; nvidia-smi peaks $p1 and $p2 MiB"

}
in_place && r_two

# A framework: its workload's output is identical with and without the shim; under a 2 GiB
# limit it gets its own out-of-memory error and nvidia-smi never sees more than the limit plus
# its overhead. $1 framework, $2 expected error pattern, $3.. environment for every run.
framework() {
  local fw=$1 err=$2
  shift 2
  $T env "$@" python3 tests/gpu/fw.py "$fw" work > "$W/$fw.plain" 2>"$W/$fw.plain.err"
  shim env "$@" CUDAPOOL_REPORT=stderr python3 tests/gpu/fw.py "$fw" work > "$W/$fw.shim" 2>"$W/$fw.shim.err"
  check "[ -s '$W/$fw.plain' ] && cmp -s '$W/$fw.plain' '$W/$fw.shim'" "$fw workload, same results ($*)" \
    "$(tail -1 "$W/$fw.shim"); $(grep -m1 'calls:' "$W/$fw.shim.err" | sed 's/^ *//')"
  if ! cmp -s "$W/$fw.plain" "$W/$fw.shim"; then
    echo "--- without the shim:"; tail -n 5 "$W/$fw.plain" "$W/$fw.plain.err"
    echo "--- with it:"; tail -n 5 "$W/$fw.shim" "$W/$fw.shim.err"
  fi
  watched "$W/$fw.idle" env "$@" python3 tests/gpu/fw.py "$fw" idle
  local ovh=$HELD
  watched "$W/$fw.fill" shim env "$@" CUDAPOOL_MEMORY_LIMIT=2GiB python3 tests/gpu/fw.py "$fw" fill
  local g e
  g=$(field granted_mib "$W/$fw.fill")
  e=$(sed -n 's/.*error=//p' "$W/$fw.fill" | tr -d "'\"\`$")
  check "[ '${g:-0}' -le 2048 ] && [ '${g:-0}' -ge 1536 ] && [ $PEAK -le $((2048 + ovh)) ] && echo '$e' | grep -Eq '$err'" \
    "$fw at a 2 GiB limit ($*)" "granted ${g:-?} MiB, error $e; nvidia-smi peak $PEAK MiB <= 2048 + overhead $ovh"
}

r_torch() {
section "PyTorch"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 $T python3 tests/gpu/train_small.py > "$W/train.plain" 2>&1
shim env PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 tests/gpu/train_small.py > "$W/train.shim" 2>&1
check "grep -q 'step 7' '$W/train.plain' && cmp -s '$W/train.plain' '$W/train.shim'" \
  "PyTorch transformer training, losses identical" "$(tail -1 "$W/train.shim")"
framework torch 'OutOfMemoryError|AcceleratorError.*out of memory' PYTORCH_NO_CUDA_MEMORY_CACHING=1
framework torch 'OutOfMemoryError' PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
framework torch 'OutOfMemoryError' PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

}
in_place && r_torch

r_frameworks() {
section "CuPy, JAX, Numba"
framework cupy 'OutOfMemoryError|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY' CUPY_DUMMY=1
# XLA's autotuner times kernels and may pick another GEMM algorithm from run to run (last-digit
# differences in the loss with or without the shim): deterministic for the comparison.
framework jax 'RESOURCE_EXHAUSTED|Out of memory|out of memory' XLA_PYTHON_CLIENT_ALLOCATOR=platform \
  "XLA_FLAGS=--xla_gpu_autotune_level=0 --xla_gpu_deterministic_ops=true"
framework numba 'CUDA_ERROR_OUT_OF_MEMORY|OUT_OF_MEMORY' NUMBA_DUMMY=1

}
in_place && r_frameworks

r_ipc() {
section "address queries and IPC of pooled blocks"
# A block is the program's allocation: sized from cuMemGetAddressRange, a memset of all of it
# works and leaves the neighbour block alone. Memory cudapool never handed out (pinned host
# memory mapped for the device) gets exactly the driver's answers.
gcc -O2 -o "$W/ranges" tests/c/ranges.c -ldl
"$W/ranges" dlsym host > "$W/ranges.plain" 2>&1
for k in split binned; do
  shim env CUDAPOOL_POOL=$k "$W/ranges" dlsym host > "$W/ranges.shim" 2>&1
  check "cmp -s '$W/ranges.plain' '$W/ranges.shim'" "pinned host memory, the driver's answers ($k)" \
    "$(grep host_memset "$W/ranges.shim")"
  shim env CUDAPOOL_POOL=$k "$W/ranges" gpa blocks > "$W/ranges.blocks" 2>&1
  check "grep -q 'memset a_rc=0 b_rc=0 a_ok=1 b_ok=1' '$W/ranges.blocks' && grep -q '^b range_rc=0 base_off=0 size=1000' '$W/ranges.blocks'" \
    "a block sized by its address range ($k)" "$(grep -E '^(b|memset|ipc) ' "$W/ranges.blocks" | tr '\n' ';')"
done
# Legacy IPC between processes, expandable (the default) and classic segments: a C exporter
# and its importers, and PyTorch's own IPC (a child reads the parent's tensors, pieces of
# PyTorch's segments that are cudapool blocks). (With PYTORCH_NO_CUDA_MEMORY_CACHING set,
# PyTorch itself cannot share CUDA tensors: "invalid device pointer", with or without cudapool.)
$T bash tests/gpu/ipc_check.sh "$LIB" "$W/ipc" > "$W/ipc.txt" 2>&1
while IFS='|' read -r verdict what detail; do
  result "$(echo $verdict)" "$(echo $what)" "$detail"
done < <(grep -E '^(PASS|FAIL) \|' "$W/ipc.txt")
[ "$(grep -cE '^(PASS|FAIL) \|' "$W/ipc.txt")" = 4 ] || result FAIL "IPC checks ran" "$(tail -3 "$W/ipc.txt")"

}
in_place && r_ipc

r_numba() {
section "numba-cuda's own driver and IPC tests, with and without cudapool"
# A real client's test suite as a regression gate: any test that passes without cudapool and
# does not pass with it is a failure. Its test-only dependencies (filecheck, cffi) travel as
# wheels in .whl (see the README's GPU suite section); without them the import errors are the
# same on both sides and the comparison still holds for the rest.
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/site" .whl/*.whl &&
    export PYTHONPATH="$W/site${PYTHONPATH:+:$PYTHONPATH}"
fi
suite() { # output file, then an optional prefix (env LD_PRELOAD=...)
  local out=$1; shift
  timeout 300 "$@" python3 tests/gpu/suite.py "$out.outcomes" numba.cuda.tests.cudadrv \
    numba.cuda.tests.cudapy.test_ipc > "$out" 2>&1
  awk '$2 == "ok" { print $1 }' "$out.outcomes" | sort -u > "$out.passed"
  tail -1 "$out"
}
echo "without: $(suite "$W/numba-suite.plain")"
echo "with:    $(suite "$W/numba-suite.shim" env LD_PRELOAD="$LIB")"
cp "$W/numba-suite.plain" "$OUT/numba-suite-plain.log"
cp "$W/numba-suite.shim" "$OUT/numba-suite-cudapool.log"
lost=$(comm -23 "$W/numba-suite.plain.passed" "$W/numba-suite.shim.passed")
n_plain=$(wc -l < "$W/numba-suite.plain.passed")
n_shim=$(wc -l < "$W/numba-suite.shim.passed")
n_lost=$(echo "$lost" | grep -c .)
[ "$n_lost" -gt 0 ] && printf 'passes without cudapool, not with it:\n%s\n' "$lost"
check "[ $n_plain -gt 0 ] && [ $n_lost = 0 ]" "numba-cuda cudadrv suite, same passing set" \
  "$n_plain passed without, $n_shim with; $n_lost lost"

if ls dist/cudapool-*.whl > /dev/null 2>&1; then
  echo "=== the pip wheel (dist/, from scripts/build-wheel.sh) on this machine"
  # A fresh venv that still sees this machine's PyTorch (whose python3 may itself be a venv:
  # a .pth file names its site-packages); the wheel's command runs the training.
  python3 -m venv "$W/venv" &&
    python3 -c 'import site; print(site.getsitepackages()[0])' > \
      "$("$W/venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')/machine.pth" &&
    "$W/venv/bin/python" -m pip install -q --no-index --no-deps "$(ls -t dist/cudapool-*.whl | head -1)"
  $T "$W/venv/bin/cudapool" run --pool split -- env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    "$W/venv/bin/python" tests/gpu/train_small.py > "$W/train.wheel" 2>&1
  check "cmp -s '$W/train.plain' '$W/train.wheel' && '$W/venv/bin/python' -c 'import cudapool; print(cudapool.library_path())' | grep -q site-packages" \
    "PyTorch training under the pip-installed cudapool, losses identical" "$(tail -1 "$W/train.wheel")"
fi

}
in_place && r_numba

r_viewer() {
section "PyTorch's memory viewer reads a cudapool snapshot"
shim env PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUDAPOOL_HISTORY=100000 CUDAPOOL_TRACK=2 \
  python3 tests/gpu/torch_snapshot.py "$OUT" > "$W/viz.out" 2>&1
cat "$W/viz.out"
check "grep -q '^segments=' '$W/viz.out' && grep -q 'total_reserved' '$W/viz.out' && [ -s '$OUT/memory_viz_trace_plot.html' ] && [ -s '$OUT/memory_viz_segment_plot.html' ]" \
  "torch.cuda._memory_viz on a snapshot of a training step" "$(head -1 "$W/viz.out")"

# compute-sanitizer sees pooled blocks (its own script; its PASS/FAIL lines join this table).
RESULTS="$RESULTS" OUT="$OUT" bash tests/gpu/gpu-sanitizer-check.sh

}
in_place && r_viewer

# Two devices (a run that sees two): per-device limits, one thread switching, peer copies, NCCL.
r_devices() {
[ "$NGPU" -ge 2 ] || return 0
section "two devices: per-device limits, peer copies, NCCL (tests/gpu/programs/multi.cu, torchrun)"
# The rest half beside the quick half on two GPUs: these rows use the quick half's GPU too,
# so they wait for it to finish (GPU_DEVICES_AFTER: a file the quick half's run leaves).
if [ -n "${GPU_DEVICES_AFTER:-}" ]; then
  for _ in $(seq 600); do [ -e "$GPU_DEVICES_AFTER" ] && break; sleep 1; done
  echo "(waited for $GPU_DEVICES_AFTER: $([ -e "$GPU_DEVICES_AFTER" ] && echo there || echo 'not there after 600 s'))"
fi
  shim env CUDAPOOL_MEMORY_LIMIT=0=1GiB,1=2GiB "$W/multi" > "$W/multi.out" 2>&1
  rc=$?
  cat "$W/multi.out"
  check "grep -q 'dev0_mib=1024 dev1_mib=2048' '$W/multi.out'" "per-device limits 1 GiB, 2 GiB" "$(grep limits "$W/multi.out")"
  check "grep -q 'switching ok' '$W/multi.out'" "one thread switching devices" "$(grep switching "$W/multi.out")"
  check "[ $rc = 0 ] && grep -q 'peer ok' '$W/multi.out'" "peer copies between pool blocks" "$(grep peer "$W/multi.out")"
  # NCCL's buffers in the snapshot PyTorch's viewer reads.
  shim env CUDAPOOL_HISTORY=10000 torchrun --nproc_per_node 2 tests/gpu/nccl_snapshot.py "$W" > "$W/nccl.out" 2>&1
  cat "$W/nccl.out" | grep '^rank'
  check "[ \$(grep -c 'rank .*ok$' '$W/nccl.out') = 2 ]" "NCCL all-reduce buffers in each rank's torch snapshot" "$(grep '^rank 0' "$W/nccl.out")"
  # An all-reduce captured in a CUDA graph on both GPUs (how serving engines run tensor parallel).
  shim timeout 300 torchrun --nproc_per_node 2 tests/gpu/capture/nccl_capture.py > "$W/nccl_capture.out" 2>&1
  grep '^rank' "$W/nccl_capture.out"
  check "[ \$(grep -c '^rank .*ok$' '$W/nccl_capture.out') = 2 ]" "NCCL all-reduce captured in a CUDA graph, two GPUs" \
    "$(grep '^rank' "$W/nccl_capture.out" | tr '\n' ';')"
}
in_place && r_devices

r_exporter() {
section "cudapool exporter: a PyTorch run scraped while it trains"
if [ -x target/release/cudapool ]; then
  $T python3 tests/gpu/exporter_check.py "$PWD/target/release/cudapool" "$LIB" > "$W/exporter.out" 2>&1
  cat "$W/exporter.out"
  check "grep -q 'exporter check ok' '$W/exporter.out'" "exporter figures beside torch.cuda and nvidia-smi" \
    "$(grep '^| 2 ' "$W/exporter.out")"
else
  result FAIL "exporter" "carry target/release/cudapool too"
fi

}
in_place && r_exporter

r_nvml() {
section "NVML under cudapool: nvidia-smi and pynvml see the budget (tests/gpu/nvml_check.sh)"
if [ -x target/release/cudapool ]; then
  $T bash tests/gpu/nvml_check.sh > "$W/nvml.out" 2>&1
  cat "$W/nvml.out"
  while read -r verdict what; do
    result "$verdict" "NVML: ${what%% (*}" "$(echo "$what" | sed -n 's/.*(\(.*\))$/\1/p')"
  done < <(grep -E '^(PASS|FAIL) ' "$W/nvml.out")
else
  result FAIL "NVML" "carry target/release/cudapool too"
fi

}
in_place && r_nvml

r_preempt() {
section "a preemptor's allocation while the job suspended for it gives its memory back (tests/gpu/sleep/preempt_check.py)"
# The whole GPU: a 30 GiB holder and an asker of all the free memory and 16 GiB more. Alone.
timeout 240 python3 tests/gpu/sleep/preempt_check.py "$LIB" > "$W/preempt.out" 2>&1
rows "preemption check" "$W/preempt.out"
}
in_place && r_preempt

r_oom() {
section "the moment of OOM with PyTorch (tests/gpu/oom_check.py)"
$T python3 tests/gpu/oom_check.py "$LIB" "$W/oom" > "$W/oom.out" 2>&1
cat "$W/oom.out"
while read -r verdict what; do
  result "$verdict" "OOM: $what" ""
done < <(grep -E '^(PASS|FAIL) ' "$W/oom.out" | sed 's/ \[.*//')
cp "$W"/oom/oom_segment_plot.html "$OUT/" 2>/dev/null

}
in_place && r_oom

q_graphs() {
section "graph memory nodes under a limit (tests/gpu/graph_check.sh)"
$T bash tests/gpu/graph_check.sh "$LIB" "$W/graphs" > "$W/graphs.out" 2>&1
cat "$W/graphs.out"
while read -r verdict what; do
  result "$verdict" "graphs: $what" "$(grep -h '^runs_2g' "$W/graphs.out" | head -1)"
done < <(grep -E '^(PASS|FAIL) ' "$W/graphs.out" | sed 's/^\(PASS\|FAIL\) /\1 /')
}
in_place && q_graphs

q_capture() {
section "graph capture: nothing cudapool does breaks a program's capture (docs/design.md, Capture-safe)"
# The driver's rules, as the fake driver models them: one line per call, mode and thread.
timeout 120 "$W/capture_rules" > "$OUT/capture-rules.txt" 2>&1
check "grep -q 'capture rules done' '$OUT/capture-rules.txt'" "capture rules probed (capture-rules.txt)" \
  "$(grep -c '^call=' "$OUT/capture-rules.txt") cases; cuStreamQuery(capturing) ended the capture in $(grep -c '^call=cuStreamQuery(capturing).*end=901' "$OUT/capture-rules.txt") of 24"
# Two threads of a C++ program: one captures (each mode) while the other allocates and frees.
for mode in global thread_local relaxed; do
  $T "$W/capture_threads" $mode > "$W/ct.plain" 2>&1
  rc_plain=$?
  for k in split binned simple split-classic; do
    seg=expandable; pool=$k
    [ $k = split-classic ] && seg=classic pool=split
    shim env CUDAPOOL_POOL=$pool CUDAPOOL_SEGMENTS=$seg "$W/capture_threads" $mode > "$W/ct.out" 2>&1
    rc=$?
    check "[ $rc_plain = 0 ] && [ $rc = 0 ]" "two threads, one capturing ($mode), $k" \
      "$(grep -h 'captures ok' "$W/ct.out" | head -1); without cudapool: $(grep -h 'captures ok' "$W/ct.plain" | head -1)"
  done
done
# PyTorch: capture and replay, graphs sharing one pool, torch.compile(mode="reduce-overhead"),
# a thread capturing while another allocates, a cuMemCreate allocator behind MemPool under a
# limit, and an engine's sizing from cuMemGetInfo and NVML; each PyTorch mode, beside PyTorch alone.
timeout 1200 python3 tests/gpu/capture/capture_check.py "$LIB" "$W/capture" > "$W/capture.out" 2>&1
cat "$W/capture.out"
cp "$W/capture.out" "$OUT/capture-check.txt"
while IFS='|' read -r verdict what detail; do
  result "$(echo $verdict)" "$(echo $what)" "$(echo $detail)"
done < <(grep -E '^(PASS|FAIL) \|' "$W/capture.out")
grep -q '^capture check: ' "$W/capture.out" || result FAIL "capture check ran" "$(tail -3 "$W/capture.out")"
}
in_place && q_capture

r_group() {
section "a group of two PyTorch processes under one limit; one killed, the other grows"
$T python3 tests/gpu/group_check.py "$LIB" > "$W/group.out" 2>&1
cat "$W/group.out"
check "grep -q 'group check ok' '$W/group.out'" "two processes in one group: nvidia-smi within the group limit, a killed member's share back" \
  "$(grep -A2 '^| group limit' "$W/group.out" | tail -1)"

}
in_place && r_group

q_give_back() { # [sides [group]]: all by default (tests/gpu/give_back/check.py)
local tag=${1:+.${1//,/-}}
section "giving back what the program gives back, seen by nvidia-smi (tests/gpu/give_back/check.py${1:+, sides $1})"
GIVE_BACK_SIDES=${1:-} GIVE_BACK_GROUP=${2:-1} $T python3 tests/gpu/give_back/check.py "$LIB" > "$W/give_back$tag.out" 2>&1
cp "$W/give_back$tag.out" "$OUT/give-back$tag.txt"
rows "give-back check${1:+ ($1)}" "$W/give_back$tag.out"
}
in_place && q_give_back

q_suspend() {
section "suspend: processes stopped by SIGTSTP give their GPU memory back (tests/gpu/sleep/suspend_check.py)"
# Beside the other lanes the host's memory bandwidth is shared: the quick tier checks what a
# stop does, the full suite also that it fits Slurm's 2 s.
SUSPEND_WINDOW_S=$([ "$TIER" = quick ] && echo 6 || echo 2) timeout 180 python3 tests/gpu/sleep/suspend_check.py "$LIB" > "$W/suspend.out" 2>&1
cp "$W/suspend.out" "$OUT/suspend-check.txt"
rows "suspend check" "$W/suspend.out"
section "the driver's checkpoint of a process that does not sleep, as root's arbiter uses it (tests/gpu/sleep/checkpoint_check.py)"
timeout 180 python3 tests/gpu/sleep/checkpoint_check.py "$LIB" "$PWD/target/release/cudapool" > "$W/checkpoint.out" 2>&1
rows "checkpoint check" "$W/checkpoint.out"
}
in_place && q_suspend

q_peers() {
section "the peers' own memory tests: PyTorch's test_cuda.py, CuPy's test_memory.py, with and without cudapool (tests/gpu/peers/peers.sh)"
bash tests/gpu/peers/peers.sh "$LIB" "$W/peers" > "$W/peers.out" 2>&1
rows "peers' memory tests" "$W/peers.out"
}
in_place && q_peers

s_sleep() {
section "sleep and wake: $SLEEP_GIB GiB to the host and back, PyTorch in each mode, cudapool sleep PID (tests/gpu/sleep/sleep_check.sh)"
SLEEP_PARALLEL=$([ "$TIER" = quick ] && echo 1 || echo 0) timeout 600 bash tests/gpu/sleep/sleep_check.sh "$LIB" "$W/sleep" "$SLEEP_GIB" > "$W/sleep.out" 2>&1
cat "$W/sleep.out"
cp "$W/sleep.out" "$OUT/sleep-check.txt"
while read -r verdict rest; do
  result "$verdict" "sleep: ${rest%% | *}" "$(echo "$rest" | sed -n 's/^[^|]*| //p')"
done < <(grep -E '^(PASS|FAIL) ' "$W/sleep.out")
grep -q '^PASS' "$W/sleep.out" || result FAIL "sleep check ran" "$(tail -3 "$W/sleep.out")"
}

# The halves run side by side in lanes: every check in a lane reads its own processes' memory
# (nvidia-smi by pid, or cudapool's limit), so the lanes cannot disturb one another's verdicts;
# what reads the whole device (or times a copy) runs alone after them. The quick tier's sleep
# figures and suspend's time are taken beside the others and measure nothing (the rest tier's
# sleep runs alone, the full suite's suspend too).
LANES=()
lane() { # name, the sections it runs one after the other
  local name=$1
  shift
  (
    RESULTS="$W/lane.$name.results"
    : > "$RESULTS"
    for f in "$@"; do "$f"; done
  ) > "$W/lane.$name.log" 2>&1 &
  LANES+=("$name:$!")
}
lanes_done() { # each lane's log and rows, in the order they started
  local l
  for l in "${LANES[@]}"; do
    wait "${l#*:}"
    cat "$W/lane.${l%%:*}.log"
    cat "$W/lane.${l%%:*}.results" >> "$RESULTS"
    grep -q . "$W/lane.${l%%:*}.results" || result FAIL "$TIER tier lane ${l%%:*}" "no result: $(tail -2 "$W/lane.${l%%:*}.log")"
  done
}
if [ "$TIER" = quick ]; then
  section "the quick tier's lanes, side by side (each lane's log follows when all are done)"
  give_back_beside() { q_give_back without,never,limit 1; }
  lane basics q_basics q_graphs give_back_beside
  lane capture q_capture
  lane suspend q_suspend
  lane sleep s_sleep
  lanes_done
  # Alone on the GPU: they compare the whole device's used memory with and without cudapool.
  q_give_back without,default 0
  q_peers
elif [ "$TIER" = rest ]; then
  section "the rest tier's lanes, side by side (each lane's log follows when all are done)"
  # The two devices in a lane of their own (a run that sees two), joined last: beside the
  # quick half they first wait for it (GPU_DEVICES_AFTER), then run beside the others.
  DEVICES_LANE=()
  if [ "$NGPU" -ge 2 ]; then
    lane devices r_devices
    DEVICES_LANE=("${LANES[@]}")
    LANES=()
  fi
  lane limits r_limits r_two
  # The wheel's training is compared with the PyTorch section's (train.plain).
  lane torch r_torch r_numba
  lane frameworks r_frameworks
  lane ipc r_ipc r_viewer
  lane exporter r_exporter r_oom r_group
  lanes_done
  # Then, beside the two devices' lane only: nvidia-smi's device figures under cudapool against
  # the GPU's, and the sleep of 20 GiB (its bandwidth figures: the two devices' lane copies
  # between the GPUs, not through the host; the figures of a run on one GPU have no lane beside).
  r_nvml
  s_sleep
  LANES=("${DEVICES_LANE[@]}")
  lanes_done
  # Last, alone: it takes the whole of its GPU.
  r_preempt
else
  s_sleep
fi

section "NVIDIA's CUDA samples, with and without cudapool (tests/gpu/samples.sh, run beside the rest)"
if ! full; then
  echo "not in the quick tier"
elif [ -n "${SKIP_SAMPLES:-}" ]; then
  echo "skipped (SKIP_SAMPLES is set; run tests/gpu/samples.sh on its own)"
elif [ -n "$SAMPLES_PID" ]; then
  wait "$SAMPLES_PID"
  cat "$W/samples.log"
  cat "$W/samples.results" >> "$RESULTS"
  grep -q . "$W/samples.results" || result FAIL "NVIDIA CUDA samples" "no result: $(tail -2 "$W/samples.log")"
else
  result FAIL "NVIDIA CUDA samples" "not here: run scripts/fetch-samples.sh before, and carry .samples"
fi

echo
echo "=== results ($((SECONDS - START)) s)"
cat "$RESULTS"
passed=$(grep -c '^PASS' "$RESULTS")
failed=$(grep -c '^FAIL' "$RESULTS")
skipped=$(grep -c '^SKIP' "$RESULTS")
not_run=$([ "$skipped" -gt 0 ] && echo ", $skipped not run (SKIP rows: what they need is not here)")
echo "$passed passed, $failed failed$not_run"
# The record of this run (docs/gpu/check.txt): the build it ran first, the table, the count last.
# The commit is GPU_CHECK_COMMIT where the tree was copied to the GPU machine (a copied .git
# may name another commit than the tree's), else git's.
commit=${GPU_CHECK_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
{
  echo "commit $commit"
  echo "# scripts/gpu-check.sh, $TIER tier$([ -n "${SKIP_SAMPLES:-}" ] && echo ' (SKIP_SAMPLES=1)'), $(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | sed 's/, / driver /')$([ "$NGPU" -ge 2 ] && echo " x$NGPU"), $((SECONDS - START)) s"
  cat "$RESULTS"
  echo "$passed passed, $failed failed$not_run"
} > "$OUT/check.txt"
cp "$OUT/check.txt" docs/gpu/check.txt 2>/dev/null
[ "$failed" = 0 ]
