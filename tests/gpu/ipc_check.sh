#!/usr/bin/env bash
# Legacy IPC of pooled blocks between processes on the GPU, under cudapool's default
# (expandable segments) and classic segments: tests/c/ranges.c's ipc-cross (a C exporter, its
# importer a process of its own, one without cudapool), and PyTorch's torch.multiprocessing.
# usage: bash tests/gpu/ipc_check.sh LIB OUTDIR    (prints PASS/FAIL lines)
set -u
LIB=$1 W=$2
mkdir -p "$W"
cd "$(dirname "$0")/../.."
gcc -O2 -o "$W/ranges" tests/c/ranges.c -ldl
pass() { echo "PASS | $1 | $2"; }
fail() { echo "FAIL | $1 | $2"; }
for seg in expandable classic; do
  env LD_PRELOAD="$LIB" CUDAPOOL_SEGMENTS=$seg "$W/ranges" gpa ipc-cross > "$W/cross.$seg" 2>&1
  got=$(tr '\n' ';' < "$W/cross.$seg")
  # The importer's lines: under cudapool, without it, then with the block gone. Without
  # cudapool the driver refuses a mapped block's handle; a classic block's tagged handle it
  # maps from its segment's start (the known limit: both sides must run cudapool).
  bare=$(grep '^import ' "$W/cross.$seg" | sed -n 2p)
  if [ $seg = expandable ]; then bare_ok=$(echo "$bare" | grep -c '^import open_rc=[1-9]'); else bare_ok=1; fi
  if grep -q '^export rc=0 again_rc=0 same_handle=1' "$W/cross.$seg" &&
    [ "$(grep '^import ' "$W/cross.$seg" | sed -n 1p)" = 'import open_rc=0 first=0x5c last=0x5c again_rc=0 same=1 closes=0,0,1' ] &&
    [ "$bare_ok" = 1 ] &&
    grep '^import ' "$W/cross.$seg" | sed -n 3p | grep -q '^import open_rc=[1-9]' &&
    grep -q '^parent importer_exit=0 bare_exit=0 value=0x3d' "$W/cross.$seg" &&
    grep -q '^after fds_left=0' "$W/cross.$seg"; then
    pass "IPC of a 5 MiB block across processes ($seg segments)" "$got"
  else
    fail "IPC of a 5 MiB block across processes ($seg segments)" "$got"
  fi
done
python3 tests/gpu/ipc_torch.py > "$W/torch.plain" 2>&1
for seg in expandable classic; do
  env LD_PRELOAD="$LIB" CUDAPOOL_SEGMENTS=$seg python3 tests/gpu/ipc_torch.py > "$W/torch.$seg" 2>&1
  if grep -q 'torch ipc ok' "$W/torch.plain" && grep -q 'torch ipc ok' "$W/torch.$seg"; then
    pass "torch.multiprocessing CUDA tensors, 8 up to 256 MiB ($seg segments)" "$(tail -1 "$W/torch.$seg")"
  else
    fail "torch.multiprocessing CUDA tensors, 8 up to 256 MiB ($seg segments)" "$(tail -3 "$W/torch.$seg" | tr '\n' ';')"
  fi
done
