"""A preemptor's first allocation while the job suspended for it is still giving its memory back
(docs/design.md, Suspend): on one GPU, process A of a Slurm job's group (CUDAPOOL_GROUP=slurm-...,
where a suspend sleeps) holds 30 GiB; process B, ready beside it, learns the free memory F;
then A gets SIGTSTP and B at once asks for F + 16 GiB, which only A's memory can cover.

  python3 tests/gpu/sleep/preempt_check.py LIB

- B in a Slurm job's group: its refused allocation waits for A's room and succeeds;
- B in another group (not Slurm's): the refusal is final at once (out of memory), as before.
Then A continues, wakes when B has gone, and its tensor's checksum is the same. One PASS/FAIL
row per side, with the figures (nvidia-smi's view of A, how long B waited).
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
x = torch.arange(30 << 28, dtype=torch.int32, device="cuda")  # 30 GiB
want = int(x[::4096].double().sum().item())
print("ready", flush=True)
while not os.path.exists(go):
    import time; time.sleep(0.05)
print("intact=%d" % (int(x[::4096].double().sum().item()) == want), flush=True)
'''

ASKER = r'''
import os, sys, time, torch
go, extra = sys.argv[1], int(sys.argv[2])
torch.cuda.init(); torch.empty(1, device="cuda")
free, _ = torch.cuda.mem_get_info()
print("ready free_gib=%.1f" % (free / 2**30), flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
t = time.time()
try:
    y = torch.empty(free + extra, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("asker ok waited_s=%.2f" % (time.time() - t), flush=True)
except RuntimeError as e:
    print("asker oom after_s=%.2f %s" % (time.time() - t, str(e).splitlines()[0][:80]), flush=True)
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
    b, said = start(ASKER, [go_b, str(16 << 30)], asker_group)
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
        good = "asker ok" in b and intact
        print(f"{'PASS' if good else 'FAIL'} | preemption: a Slurm job's refused allocation waits for the room a suspended job gives back | "
              f"B {said}: {b}; A intact={int(intact)}", flush=True)
        said, b, intact = side(tmp, "other", f"other-{os.getpid()}")
        good = "asker oom" in b and intact
        print(f"{'PASS' if good else 'FAIL'} | preemption: outside Slurm the refusal is final at once | "
              f"B {said}: {b}; A intact={int(intact)}", flush=True)


main()
