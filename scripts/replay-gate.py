#!/usr/bin/env python3
"""The replay gate: every allocation trace of benches/traces/ (and of ../shared/traces/ when that
folder is there) replayed by `cudapool replay` through split with expandable segments, the
default. Each must reserve at most 1.03 x its peak allocated, and no more than the reserved peak
PyTorch's allocator recorded on the same job (the file's header, where it says). Prints one
line per trace and a `test result:` line that scripts/test.sh counts.

    python3 scripts/replay-gate.py target/debug/cudapool
"""
import glob
import json
import os
import subprocess
import sys

TARGET = 1.03


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/debug/cudapool"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = sorted(glob.glob(os.path.join(root, "benches", "traces", "*.ops")))
    files += sorted(glob.glob(os.path.join(root, "benches", "traces", "*.trace")))
    shared = sorted(glob.glob(os.path.join(root, "..", "shared", "traces", "*.ops")))
    names = {os.path.basename(f) for f in files}
    files += [f for f in shared if os.path.basename(f) not in names]
    if not files:
        print("replay gate: no traces found", file=sys.stderr)
        return 1
    out = subprocess.run(
        [binary, "replay", "--json", "--pool", "split", "--segments", "expandable", *files],
        capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
        print("test result: FAILED. 0 passed; 1 failed;")
        return 1
    passed = failed = 0
    for line in out.stdout.splitlines():
        r = json.loads(line)
        ratio = r["peak_reserved_bytes"] / r["peak_allocated_bytes"]
        recorded = r["recorded_reserved_bytes"]
        ok = ratio <= TARGET and (recorded is None or r["peak_reserved_bytes"] <= recorded)
        mib = lambda b: f"{b / 2**20:,.0f} MiB"
        print(f"replay {'ok  ' if ok else 'FAIL'} {os.path.basename(r['file']):<28} "
              f"reserved {mib(r['peak_reserved_bytes']):>10} for {mib(r['peak_allocated_bytes']):>10}"
              f" allocated ({ratio:.3f}, at most {TARGET})"
              + (f", PyTorch reserved {mib(recorded)}" if recorded else ""))
        passed += ok
        failed += not ok
    print(f"test result: {'ok' if not failed else 'FAILED'}. {passed} passed; {failed} failed;")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
