"""Turns a CUDAPOOL_LOG=debug log into an allocation trace (`a ID SIZE` / `f ID` lines)."""
import re
import sys

alloc = re.compile(r"cudapool: alloc (\d+) -> (0x[0-9a-f]+)")
free = re.compile(r"cudapool: free (0x[0-9a-f]+)")
live, next_id, out = {}, 0, []
for line in open(sys.argv[1], errors="replace"):
    if m := alloc.search(line):
        next_id += 1
        live[m.group(2)] = next_id
        out.append(f"a {next_id} {m.group(1)}")
    elif (m := free.search(line)) and m.group(1) in live:
        out.append(f"f {live.pop(m.group(1))}")
out += [f"f {i}" for i in live.values()]
print(f"# {sys.argv[2] if len(sys.argv) > 2 else 'trace'}: {next_id} allocations")
print("\n".join(out))
