#!/usr/bin/env python3
"""The replay gate: every allocation trace of benches/traces/ replayed by `cudapool replay` through split with expandable segments, the
default, twice:
- with no limit (nothing is stitched): never above the reserved peak PyTorch's allocator recorded on
  the same job (the file's header, where it says), and at most DEFAULT_TARGET x its peak
  allocated (today's figures: 1.003-1.079);
- under a limit of 1.05 x its peak allocated (free memory stitched to growths): at most TARGET x its
  peak allocated, and no request refused.
Prints one line per trace and run, and a `test result:` line that scripts/test.sh counts.

    python3 scripts/replay-gate.py target/debug/cudapool [MORE_TRACE_FOLDERS...]
"""
import glob
import json
import os
import subprocess
import sys

TARGET = 1.03
DEFAULT_TARGET = 1.085
LIMIT = 1.05


def replay(binary, files, limit=None):
    args = [binary, "replay", "--json", "--pool", "split", "--segments", "expandable"]
    if limit:
        args += ["--limit", str(limit)]
    out = subprocess.run(args + files, capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
        return None
    return [json.loads(line) for line in out.stdout.splitlines()]


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/debug/cudapool"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = sorted(glob.glob(os.path.join(root, "benches", "traces", "*.ops")))
    files += sorted(glob.glob(os.path.join(root, "benches", "traces", "*.trace")))
    # More folders of traces (yours), named after the binary: their .ops files join the gate.
    names = {os.path.basename(f) for f in files}
    for folder in sys.argv[2:]:
        extra = sorted(glob.glob(os.path.join(folder, "*.ops")))
        files += [f for f in extra if os.path.basename(f) not in names]
    if not files:
        print("replay gate: no traces found", file=sys.stderr)
        return 1
    mib = lambda b: f"{b / 2**20:,.0f} MiB"
    passed = failed = 0
    default = replay(binary, files)
    if default is None:
        print("test result: FAILED. 0 passed; 1 failed;")
        return 1
    for r in default:
        ratio = r["peak_reserved_bytes"] / r["peak_allocated_bytes"]
        recorded = r["recorded_reserved_bytes"]
        ok = ratio <= DEFAULT_TARGET and (recorded is None or r["peak_reserved_bytes"] <= recorded)
        print(f"replay {'ok  ' if ok else 'FAIL'} {os.path.basename(r['file']):<28} no limit: "
              f"reserved {mib(r['peak_reserved_bytes']):>10} for {mib(r['peak_allocated_bytes']):>10}"
              f" allocated ({ratio:.3f}, at most {DEFAULT_TARGET})"
              + (f", PyTorch reserved {mib(recorded)}" if recorded else ""))
        passed += ok
        failed += not ok
        limit = int(r["peak_allocated_bytes"] * LIMIT)
        stitched = replay(binary, [r["file"]], limit)
        if not stitched:
            failed += 1
            continue
        q = stitched[0]
        ratio = q["peak_reserved_bytes"] / q["peak_allocated_bytes"]
        ok = ratio <= TARGET and q["ooms"] == 0
        print(f"replay {'ok  ' if ok else 'FAIL'} {os.path.basename(q['file']):<28} limit {mib(limit)}: "
              f"reserved {mib(q['peak_reserved_bytes']):>10} ({ratio:.3f}, at most {TARGET}), "
              f"{q['ooms']} refused")
        passed += ok
        failed += not ok
    print(f"test result: {'ok' if not failed else 'FAILED'}. {passed} passed; {failed} failed;")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
