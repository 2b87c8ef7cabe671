#!/usr/bin/env bash
# The driver's own memory held to the limit on a GPU (issue 52): tests/c/holes.c steps through
# a context, 900 MiB then 200 MiB allocated, cuCtxSetLimit of a 64 KiB stack and an 8 GiB heap,
# a PTX module with a 4 GiB global, 8 more contexts; nvidia-smi's figure for the process after
# each step. Run without cudapool, under CUDAPOOL_MEMORY_LIMIT=1GiB and under 20GiB.
#   bash tests/gpu/programs/holes.sh [OUTDIR]      (from the repository root; needs nvcc, nvidia-smi and
#                                         target/release/libcudapool.so)
set -u
cd "$(dirname "$0")/../../.."
out=${1:-${OUT:-/tmp/cudapool-holes}}
mkdir -p "$out"
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
cc -O1 -Iinclude -o "$w/holes" tests/c/holes.c -ldl || exit 2
cat > "$w/big.ptx" <<'PTX'
.version 7.0
.target sm_80
.address_size 64
.visible .global .align 8 .b8 big[4294967296];
.visible .entry touch(.param .u64 i)
{
  .reg .u64 %r<3>;
  ld.param.u64 %r1, [i];
  mov.u64 %r2, big;
  add.u64 %r2, %r2, %r1;
  st.global.u8 [%r2], 1;
  ret;
}
PTX
export HOLES_SMI=1 HOLES_ALLOC1=$((900 << 20)) HOLES_ALLOC2=$((200 << 20)) HOLES_STACK=65536 \
  HOLES_HEAP=$((8 << 30)) HOLES_MODULE="$w/big.ptx" HOLES_CTXS=8
lib=$PWD/target/release/libcudapool.so
echo "== without cudapool" | tee "$out/holes.txt"
"$w/holes" 2>&1 | tee -a "$out/holes.txt"
for limit in 1GiB 20GiB; do
  echo "== CUDAPOOL_MEMORY_LIMIT=$limit" | tee -a "$out/holes.txt"
  LD_PRELOAD=$lib CUDAPOOL_MEMORY_LIMIT=$limit "$w/holes" 2>&1 | tee -a "$out/holes.txt"
done
