"""A preemptor's allocations while the job suspended for it is still giving its memory back
(docs/design.md, Suspend): on one GPU, process A of a Slurm job's group (CUDAPOOL_GROUP=slurm-...,
where a suspend sleeps) holds 8 GiB; process B, beside it, takes all the free memory but 2 GiB;
then A gets SIGTSTP and B at once takes 1 GiB after 1 GiB until refused.

  python3 tests/gpu/sleep/preempt_check.py LIB

- B in a Slurm job's group: its first refused allocation waits for A's room (up to 2.5 s), so
  B takes A's 8 GiB too;
- B in another group (not Slurm's): the refusal is final at once, as before: B gets 2 GiB.
Then A continues, wakes when B has gone, and its tensor's checksum is the same. One PASS/FAIL
row per side, with the figures.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

LIB = os.path.abspath(sys.argv[1])

HOLDER = r'''
import os, sys, torch
go = sys.argv[1]
x = torch.arange(8 << 28, dtype=torch.int32, device="cuda")  # 8 GiB
want = int(x[::4096].double().sum().item())
print("ready", flush=True)
while not os.path.exists(go):
    import time; time.sleep(0.05)
print("intact=%d" % (int(x[::4096].double().sum().item()) == want), flush=True)
'''

ASKER = r'''
import os, sys, time, torch
go = sys.argv[1]
free, _ = torch.cuda.mem_get_info()
base = torch.empty(free - (2 << 30), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready free_gib=%.1f" % (free / 2**30), flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
t = time.time()
got = []
try:
    while True:
        got.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
except RuntimeError:
    pass
print("asker gib=%d after_s=%.2f" % (len(got), time.time() - t), flush=True)
'''


def start(code, args, group):
    e = dict(os.environ)
    e.update({"LD_PRELOAD": LIB, "CUDAPOOL_GROUP": group, "CUDAPOOL_CACHE_IDLE": "never"})
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True,
                         env=e)
    line = p.stdout.readline()
    return p, line.strip()


def side(tmp, name, asker_group):
    go_a, go_b = os.path.join(tmp, f"a-{name}"), os.path.join(tmp, f"b-{name}")
    a, _ = start(HOLDER, [go_a], f"slurm-{os.getpid()}1")
    b, said = start(ASKER, [go_b], asker_group)
    time.sleep(0.5)
    os.kill(a.pid, signal.SIGTSTP)
    open(go_b, "w").close()
    out_b = b.stdout.read()
    b.wait()
    time.sleep(0.5)
    os.kill(a.pid, signal.SIGCONT)
    open(go_a, "w").close()
    out_a = a.stdout.read()
    a.wait()
    return said, out_b.strip(), "intact=1" in out_a


def main():
    with tempfile.TemporaryDirectory() as tmp:
        said, b, intact = side(tmp, "slurm", f"slurm-{os.getpid()}2")
        gib = int(b.split("gib=")[1].split()[0]) if "gib=" in b else -1
        good = gib >= 8 and intact
        print(f"{'PASS' if good else 'FAIL'} | preemption: a Slurm job's refused allocation waits for the room a suspended job gives back (8 GiB) | "
              f"B {said}: {b}; A intact={int(intact)}", flush=True)
        said, b, intact = side(tmp, "other", f"other-{os.getpid()}")
        gib = int(b.split("gib=")[1].split()[0]) if "gib=" in b else -1
        good = 0 <= gib <= 3 and intact
        print(f"{'PASS' if good else 'FAIL'} | preemption: outside Slurm the refusal is final at once (2 GiB) | "
              f"B {said}: {b}; A intact={int(intact)}", flush=True)


main()
