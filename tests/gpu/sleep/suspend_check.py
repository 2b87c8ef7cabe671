"""Suspend frees the GPU (docs/design.md, Suspend), seen by nvidia-smi: PyTorch processes that
hold 4 GiB each, with a copy to the host every 20 ms (device work that would wake a process
asleep), stopped from outside by SIGTSTP as Slurm and a shell's Ctrl-Z stop a process.

  python3 tests/gpu/sleep/suspend_check.py LIB

- alone: CUDAPOOL_SUSPEND=sleep; SIGTSTP: how long until the process is stopped, and what
  nvidia-smi shows for it then; a neighbour process takes 4 GiB meanwhile and lets go;
  SIGCONT: its figure back, and its tensor's checksum the same.
- group: two members of CUDAPOOL_GROUP=g, CUDAPOOL_SUSPEND=sleep (the default only in a Slurm
  job's group); SIGTSTP to the
  first only: the second, still running, falls too and stays down while the first is stopped;
  SIGCONT to the first: both back, both checksums the same.
- keep: CUDAPOOL_SUSPEND=keep: stopped, the process keeps its memory (as without cudapool).

Prints one PASS/FAIL line per check, with the figures. The process must be stopped within
Slurm's 2 s (SUSPEND_WINDOW_S changes it: the quick tier runs this beside other work that
shares the host's memory bandwidth, and checks the behaviour, not the time).
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

LIB = os.path.abspath(sys.argv[1])
GPU = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
WINDOW = float(os.environ.get("SUSPEND_WINDOW_S", "2.0"))

CHILD = r'''
import os, sys, torch
go = sys.argv[1]
x = torch.arange(1 << 30, dtype=torch.int32, device="cuda")  # 4 GiB
want = int(x.double().sum().item())
print("ready", flush=True)
while not os.path.exists(go):
    x[12345].item()
    import time; time.sleep(0.02)
print("intact=%d" % (int(x.double().sum().item()) == want), flush=True)
'''

NEIGHBOUR = r'''
import torch
y = torch.empty(4 << 30, dtype=torch.int8, device="cuda"); torch.cuda.synchronize()
print("neighbour ok", flush=True)
'''


def smi(pid):
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                           "--format=csv,noheader,nounits", "-i", GPU],
                          capture_output=True, text=True).stdout
    return sum(int(u) for p, u in (l.split(", ") for l in apps.strip().splitlines() if l)
               if int(p) == pid)


def stopped(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(") ", 1)[1].startswith("T")


def until(limit, what):
    t = time.time()
    while time.time() - t < limit:
        if what():
            return True
        time.sleep(0.02)
    return what()


def start(go, env):
    e = dict(os.environ)
    e.update({"LD_PRELOAD": LIB, "CUDAPOOL_CACHE_IDLE": "never"})
    e.update(env)
    p = subprocess.Popen([sys.executable, "-c", CHILD, go], stdout=subprocess.PIPE, text=True,
                         env=e)
    for line in p.stdout:
        if line.strip() == "ready":
            return p
    raise SystemExit(f"FAIL | suspend | a child ended before it was ready ({p.wait()})")


def end(p, go):
    open(go, "w").close()
    out = p.stdout.read()
    p.wait()
    return "intact=1" in out


def row(good, what, detail):
    print(f"{'PASS' if good else 'FAIL'} | suspend: {what} | {detail}", flush=True)


def alone(tmp):
    go = os.path.join(tmp, "go-alone")
    p = start(go, {"CUDAPOOL_SUSPEND": "sleep"})
    time.sleep(0.5)
    before = smi(p.pid)
    t = time.time()
    os.kill(p.pid, signal.SIGTSTP)
    until(30, lambda: stopped(p.pid))
    took = time.time() - t
    asleep = smi(p.pid)
    n = subprocess.run([sys.executable, "-c", NEIGHBOUR], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    os.kill(p.pid, signal.SIGCONT)
    back = until(30, lambda: smi(p.pid) >= before - 64)
    after = smi(p.pid)
    intact = end(p, go)
    row(asleep < before - 4000 and back and intact and took < WINDOW,
        "a PyTorch process stopped by SIGTSTP (CUDAPOOL_SUSPEND=sleep)",
        f"nvidia-smi {before} MiB, stopped after {took:.2f} s (within {WINDOW:g} s) holding {asleep} MiB; a neighbour's 4 GiB: "
        f"{'ok' if 'neighbour ok' in n.stdout else 'refused'}; continued: {after} MiB, intact={int(intact)}")


def group(tmp):
    go = os.path.join(tmp, "go-group")
    env = {"CUDAPOOL_GROUP": f"suspend-{os.getpid()}", "CUDAPOOL_SUSPEND": "sleep"}
    a, b = start(go, env), start(go, env)
    time.sleep(0.5)
    ba, bb = smi(a.pid), smi(b.pid)
    os.kill(a.pid, signal.SIGTSTP)
    fell = until(30, lambda: stopped(a.pid) and smi(b.pid) < bb - 4000)
    time.sleep(1.0)
    held = smi(b.pid)
    b_runs = not stopped(b.pid)
    os.kill(a.pid, signal.SIGCONT)
    back = until(30, lambda: smi(b.pid) >= bb - 64 and smi(a.pid) >= ba - 64)
    ok_b, ok_a = end(b, go), end(a, go)
    row(fell and held < bb - 4000 and b_runs and back and ok_a and ok_b,
        "a group member stopped: the other, running, sleeps with it and wakes when it continues",
        f"member 2: {bb} MiB, then {held} MiB a second after member 1 stopped (running: {b_runs}); "
        f"both back: {back}; intact={int(ok_a)},{int(ok_b)}")


def keep(tmp):
    go = os.path.join(tmp, "go-keep")
    p = start(go, {"CUDAPOOL_SUSPEND": "keep"})
    time.sleep(0.5)
    before = smi(p.pid)
    os.kill(p.pid, signal.SIGTSTP)
    until(30, lambda: stopped(p.pid))
    time.sleep(0.5)
    kept = smi(p.pid)
    os.kill(p.pid, signal.SIGCONT)
    intact = end(p, go)
    row(kept >= before - 64 and intact, "CUDAPOOL_SUSPEND=keep: a stopped process keeps its memory",
        f"{before} MiB, stopped {kept} MiB, intact={int(intact)}")


with tempfile.TemporaryDirectory() as tmp:
    alone(tmp)
    group(tmp)
    keep(tmp)
print("suspend check done")
