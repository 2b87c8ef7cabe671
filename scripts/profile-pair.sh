#!/usr/bin/env bash
# Where a cached pair's instructions go (issue 26, part 2): the test client's alloc+free loop
# (4 KiB cuMemAlloc_v2 + cuMemFree_v2, one thread, linked against the fake driver) under
# callgrind, with cudapool preloaded; prints instructions per pair, inclusive, for the hook and
# the parts under it. Instruction counts, not time: the same on every machine and run, so a
# change to the hot path shows as a difference here before any GPU can resolve it. Needs
# valgrind, the release library (cargo build --release) and the test fixtures (cargo test).
#   bash scripts/profile-pair.sh [PAIRS]        (default 200000)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
D=target/tmp/preload
[ -x "$D/client_linked" ] || { echo "profile-pair: run cargo test first (it builds $D)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
(cd "$D" && LD_LIBRARY_PATH=. LD_PRELOAD="${PAIR_LIB:-$PWD/../../release/libcudapool.so}" \
  valgrind --tool=callgrind --callgrind-out-file="$out" ./client_linked link pairs 4096 "$N" >/dev/null 2>&1)
callgrind_annotate --inclusive=yes "$out" 2>/dev/null | awk -v n="$N" '
  # Each line is FILE:FUNCTION [OBJECT]; inlined code shows a function under several files,
  # each line inclusive of the same calls: the largest is the inclusive cost of the function.
  /^ *[0-9,]+ \(/ {
    v = $1; gsub(",", "", v); v += 0
    f = $0; sub(/^ *[0-9,]+ \([ 0-9.]+%\) +/, "", f); sub(/^[^:]*:/, "", f); sub(/ \[.*$/, "", f)
    if (!(f in ir) || v > ir[f]) ir[f] = v
  }
  function row(label, fn) { printf "| %s | %s |\n", label, (fn in ir) ? sprintf("%.0f", ir[fn] / n) : "-" }
  END {
    print "| part of a 4 KiB cuMemAlloc_v2 + cuMemFree_v2 pair | instructions per pair |"
    print "| --- | --- |"
    row("all of cudapool: the hook guard (panic boundary, re-entry flag) and below", "cudapool::abi::hooks::guard::hook")
    row("cuMemAlloc_v2 hook", "cuMemAlloc_v2")
    row("cuMemFree_v2 hook", "cuMemFree_v2")
    row("pool free: into the thread magazine (ThreadCache::keep; its take is inlined in the alloc hook)", "cudapool::pool::reuse::magazines::ThreadCache::keep")
    row("live table insert (the thread front)", "cudapool::state::live::LiveTable::insert")
    row("live table remove (the thread front)", "cudapool::state::live::LiveTable::find")
    row("budget counters on alloc (the thread line, peaks)", "cudapool::limits::budget::DeviceBudget::on_alloc")
    row("budget counters on free", "cudapool::limits::budget::DeviceBudget::on_free")
    row("thread-local lookups through __tls_get_addr", "__tls_get_addr")
    row("the reuse rule (the clock)", "<cudapool::state::clock::ContextClock as cudapool::pool::reuse::Clock>::rule")
  }'
