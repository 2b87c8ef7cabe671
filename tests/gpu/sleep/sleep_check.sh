#!/usr/bin/env bash
# Sleep and wake on the GPU (docs/design.md, Sleep and wake): a C++ program's 20 GiB to the host
# and back beside a pinned copy of the same bytes, its footprint by nvidia-smi awake and asleep,
# 1000 cycles with host memory flat and the footprint asleep after them the same, a graph
# replayed after the wake; PyTorch in each allocator mode, CuPy, JAX; a training job asleep every
# 10 steps; `cudapool sleep --wait PID` from outside; a shared GPU with CUDAPOOL_SLEEP_IDLE.
# Prints PASS/FAIL rows. SLEEP_PARALLEL=1 runs the parts side by side (each reads its own
# process's footprint, so the rows hold; the bandwidth figures are then taken beside the others
# and are no measurement): the quick tier's way to fit its time.
#   bash tests/gpu/sleep/sleep_check.sh LIB WORKDIR [GIB]
set -u
LIB=$1 W=$2 GIB=${3:-20}
export PYTHONPATH=$PWD/cbindings/python${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$W"
CLI=$(dirname "$LIB")/cudapool
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; }
smi_used() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p="$1" '$1==p {print $2}'; }
nvcc -O2 -o "$W/sleep_wake" tests/gpu/programs/sleep_wake.cu || { fail "sleep_wake built"; exit 1; }

# The C++ program: awake and asleep footprints read while it holds.
part_cpp() {
LD_PRELOAD=$LIB timeout 300 "$W/sleep_wake" "$GIB" 256 4 1000 > "$W/sw.out" 2>&1 &
job=$!
awake="" asleep="" after=""
while kill -0 $job 2>/dev/null; do
  pid=$(sed -n 's/^filled pid=\([0-9]*\).*/\1/p' "$W/sw.out")
  if [ -z "$awake" ] && [ -n "$pid" ]; then sleep 1; awake=$(smi_used $pid); fi
  if [ -z "$asleep" ] && grep -q '^asleep round=0' "$W/sw.out"; then sleep 1; asleep=$(smi_used $pid); fi
  if [ -z "$after" ] && grep -q '^asleep_after_cycles' "$W/sw.out"; then sleep 1; after=$(smi_used $pid); fi
  sleep 0.2
done
wait $job; rc=$?
cat "$W/sw.out"
echo "nvidia-smi: awake ${awake:-?} MiB, asleep ${asleep:-?} MiB, asleep after the cycles ${after:-?} MiB"
f() { sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p" "$W/sw.out" | sed -n "${2:-1}p"; }
[ $rc = 0 ] && pass "C++ ${GIB} GiB: every byte back after a wake by launch and by the API, graph replayed | $(grep -h '^woken' "$W/sw.out" | tr '\n' ' ')" \
  || fail "C++ ${GIB} GiB: every byte back | rc=$rc $(tail -2 "$W/sw.out" | tr '\n' ' ')"
[ -n "$asleep" ] && [ "$asleep" -le 1024 ] && pass "C++ asleep: ${asleep} MiB on the GPU by nvidia-smi (awake ${awake} MiB)" \
  || fail "C++ asleep: ${asleep:-?} MiB on the GPU by nvidia-smi (awake ${awake:-?} MiB)"
echo "figures | first sleep $(f sleep_gbs 1) GB/s, second $(f sleep_gbs 2) GB/s; wake by launch $(f wake_gbs 1) GB/s, by API $(f wake_gbs 2) GB/s; pinned d2h $(f d2h_gbs) GB/s h2d $(f h2d_gbs) GB/s, pinning $(f pin_s) s"
grep -q '^cycles' "$W/sw.out" && [ "$(f wrong 3)" = 0 ] && grep -q '^woken_after_cycles rc=0 wrong=0' "$W/sw.out" \
  && [ -n "$after" ] && [ -n "$asleep" ] && [ "$after" -le $((asleep + 2)) ] \
  && pass "1000 sleep/wake cycles: nothing lost, host memory flat, asleep after them ${after} MiB by nvidia-smi (first sleep ${asleep}) | $(grep -h '^cycles' "$W/sw.out")" \
  || fail "1000 sleep/wake cycles | asleep after ${after:-?} MiB (first ${asleep:-?}) $(grep -h '^cycles\|_after_cycles' "$W/sw.out" | tr '\n' ' ')"
}

# PyTorch in one allocator mode.
part_torch() {
  local mode=$1 env="" rc row slept
  [ $mode = cache_off ] && env="PYTORCH_NO_CUDA_MEMORY_CACHING=1"
  [ $mode = pooled ] && env="PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"
  [ $mode = expandable ] && env="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
  env $env LD_PRELOAD=$LIB timeout 300 python3 tests/gpu/sleep/sleep_torch.py $mode > "$W/t.$mode" 2>&1
  rc=$?
  row=$(grep -h '^row' "$W/t.$mode")
  slept=$(echo "$row" | sed -n 's/.*used_asleep_mib=\([0-9]*\).*/\1/p')
  [ $rc = 0 ] && [ -n "$slept" ] && [ "$slept" -le 800 ] \
    && pass "PyTorch $mode: same results bit for bit after the wake, graph replayed, ${slept} MiB asleep by nvidia-smi | $row" \
    || fail "PyTorch $mode | rc=$rc $row $(tail -2 "$W/t.$mode" | tr '\n' ' ')"
}

# From outside: an idle PyTorch process, `cudapool sleep --wait` and its next launch.
part_cli() {
cat > "$W/idle.py" <<'PY'
import os, sys, torch
x = torch.randn(8192, 8192 * 4, device="cuda")
ref = x.sum().item()
print("ready", os.getpid(), flush=True)
sys.stdin.readline()
print("same", int(x.sum().item() == ref), flush=True)
PY
coproc IDLE { LD_PRELOAD=$LIB timeout 120 python3 "$W/idle.py" 2>&1; }
read -r _ ipid <&"${IDLE[0]}"
before=$(smi_used $ipid)
out=$("$CLI" sleep --wait "$ipid" 2>&1); crc=$?
sleep 1; during=$(smi_used $ipid)
"$CLI" stat "$ipid"
echo go >&"${IDLE[1]}"
read -r same <&"${IDLE[0]}"
wait
echo "cli: $out; nvidia-smi $before -> $during MiB; $same"
[ $crc = 0 ] && [ "$same" = "same 1" ] && [ "${during:-99999}" -lt "${before:-0}" ] \
  && pass "cudapool sleep --wait PID of an idle PyTorch process: $before -> $during MiB by nvidia-smi, woken by its next launch | $out" \
  || fail "cudapool sleep --wait PID | rc=$crc $out; $before -> $during MiB; $same"
}

# A Hugging Face job put to sleep every 10 steps for 200 steps: the same loss, bit for bit.
part_train() {
LD_PRELOAD=$LIB timeout 300 python3 tests/gpu/sleep/sleep_train.py train 200 0 > "$W/train.plain" 2>&1 &
LD_PRELOAD=$LIB timeout 300 python3 tests/gpu/sleep/sleep_train.py train 200 10 > "$W/train.slept" 2>&1
wait
plain=$(grep '^train' "$W/train.plain")
slept=$(grep '^train' "$W/train.slept")
echo "$plain"; echo "$slept"
lp=$(echo "$plain" | sed -n 's/.*loss=\([^ ]*\).*/\1/p'); ls=$(echo "$slept" | sed -n 's/.*loss=\([^ ]*\).*/\1/p')
[ -n "$lp" ] && [ "$lp" = "$ls" ] && echo "$slept" | grep -q 'sleeps=20' \
  && pass "HF GPT-2 (4 layers) trained 200 steps, asleep every 10: the same loss bit for bit | $plain; $slept" \
  || fail "HF training asleep every 10 steps | $plain; $slept"
}
part_cupy() {
out=$(LD_PRELOAD=$LIB timeout 300 python3 tests/gpu/sleep/sleep_train.py cupy 2>&1)
row=$(echo "$out" | grep "^cupy ")
echo "$row" | grep -q 'same=1' && echo "$row" | grep -q 'awake=1' && ! echo "$row" | grep -q 'asleep_mib=0 ' \
  && pass "cupy: an array survives a sleep, woken by its next launch | $row" \
  || fail "cupy sleep | $row $(echo "$out" | tail -2 | tr '\n' ' ')"
}
# JAX with its platform allocator: its arrays sleep.
part_jax_platform() {
out=$(env XLA_PYTHON_CLIENT_ALLOCATOR=platform LD_PRELOAD=$LIB timeout 300 python3 tests/gpu/sleep/sleep_train.py jax 2>&1)
row=$(echo "$out" | grep "^jax ")
echo "$row" | grep -q 'same=1' && echo "$row" | grep -q 'awake=1' && ! echo "$row" | grep -q 'asleep_mib=0 ' \
  && pass "jax (XLA_PYTHON_CLIENT_ALLOCATOR=platform): an array sleeps and is the same after its next launch woke it | $row" \
  || fail "jax platform allocator sleep | $row $(echo "$out" | tail -2 | tr '\n' ' ')"
}
# JAX's own allocator maps its memory itself (cuMemCreate): the program's own virtual memory.
part_jax_own() {
out=$(env XLA_PYTHON_CLIENT_PREALLOCATE=false LD_PRELOAD=$LIB timeout 300 python3 tests/gpu/sleep/sleep_train.py jax 2>&1)
row=$(echo "$out" | grep "^jax ")
echo "$row" | grep -q 'same=1' && echo "$row" | grep -q 'awake=1' && ! echo "$row" | grep -q 'asleep_mib=0 ' \
  && pass "jax (its own allocator, XLA_PYTHON_CLIENT_PREALLOCATE=false): an array sleeps and is the same after its next launch woke it | $row" \
  || fail "jax sleep | $row $(echo "$out" | tail -2 | tr '\n' ' ')"
}

# A shared GPU: the idle member sleeps before the other is refused.
part_group() {
timeout 900 python3 tests/gpu/sleep/sleep_group.py "$LIB" "$W/group" > "$W/group.out" 2>&1
cat "$W/group.out"
grep -q '^sleep group ok' "$W/group.out" \
  && pass "two PyTorch members under 1.5x what one needs: with CUDAPOOL_SLEEP_IDLE the idle one sleeps, the other allocates with no OOM, the idle one wakes intact | $(grep -h '^row' "$W/group.out" | tr '\n' ' ')" \
  || fail "shared GPU with CUDAPOOL_SLEEP_IDLE | $(tail -3 "$W/group.out" | tr '\n' ' ')"
}

run_part() { "part_$1" "${@:2}"; }
parts=(cpp "torch cache_on" "torch cache_off" "torch pooled" "torch expandable" cli train cupy jax_platform jax_own group)
if [ "${SLEEP_PARALLEL:-0}" = 1 ]; then
  # Side by side, each into its own file; shown and judged in the order above.
  pids=()
  for i in "${!parts[@]}"; do
    # shellcheck disable=SC2086
    run_part ${parts[$i]} > "$W/part.$i" 2>&1 &
    pids+=($!)
  done
  for i in "${!parts[@]}"; do
    wait "${pids[$i]}"
    cat "$W/part.$i"
  done
else
  for p in "${parts[@]}"; do
    # shellcheck disable=SC2086
    run_part $p
  done
fi
