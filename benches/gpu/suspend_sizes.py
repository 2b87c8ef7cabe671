"""How long a stop takes when the stopped process first gives its GPU memory back
(CUDAPOOL_SUSPEND=sleep; docs/deploying.md, "Suspend and preemption"): Slurm stops a job 2 s
after its SIGTSTP, so what matters is the time from the signal to the process stopped, against
the bytes it held. A PyTorch process holds N GiB (an int32 tensor, written), then a copy every
20 ms; SIGTSTP; the time until /proc says it is stopped, and nvidia-smi's figure then; SIGCONT;
the tensor's sum the same. Rounds alternate the sizes; prints one line per round.

  python3 benches/gpu/suspend_sizes.py LIB [GIB ...] [--rounds R]
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

args = [a for i, a in enumerate(sys.argv[1:], 1)
        if not a.startswith("--") and sys.argv[i - 1] != "--rounds"]
LIB = os.path.abspath(args[0])
SIZES = [int(a) for a in args[1:]] or [4, 16, 36]
ROUNDS = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 2
GPU = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"

CHILD = r'''
import os, sys, time, torch
gib, go = int(sys.argv[1]), sys.argv[2]
x = torch.empty(gib << 28, dtype=torch.int32, device="cuda").random_(0, 1 << 30)
want = int(x.sum().item())
torch.cuda.synchronize()
torch.cuda.empty_cache()  # only the tensor stays: what is copied is what is held
print("ready", flush=True)
while not os.path.exists(go):
    x[12345].item()
    time.sleep(0.02)
print("intact=%d" % (int(x.sum().item()) == want), flush=True)
'''


def smi(pid):
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits", "-i", GPU],
                         capture_output=True, text=True).stdout
    return sum(int(u) for p, u in (l.split(", ") for l in out.strip().splitlines() if l)
               if int(p) == pid)


def stopped(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(") ", 1)[1].startswith("T")


def one(gib, tmp):
    go = os.path.join(tmp, f"go-{gib}-{time.time()}")
    env = dict(os.environ, LD_PRELOAD=LIB, CUDAPOOL_SUSPEND="sleep", CUDAPOOL_CACHE_IDLE="never")
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(gib), go], stdout=subprocess.PIPE,
                         text=True, env=env)
    for line in p.stdout:
        if line.strip() == "ready":
            break
    before = smi(p.pid)
    t = time.perf_counter()
    os.kill(p.pid, signal.SIGTSTP)
    while not stopped(p.pid):
        time.sleep(0.002)
    took = time.perf_counter() - t
    asleep = smi(p.pid)
    os.kill(p.pid, signal.SIGCONT)
    open(go, "w").close()
    out = p.stdout.read()
    p.wait()
    print(f"suspend gib={gib} nvidia_smi_mib={before} stopped_after_s={took:.3f} "
          f"held_stopped_mib={asleep} given_back_gbs={(before - asleep) * 2**20 / took / 1e9:.1f} "
          f"{out.strip()}", flush=True)


with tempfile.TemporaryDirectory() as tmp:
    for r in range(ROUNDS):
        for gib in (SIZES if r % 2 == 0 else SIZES[::-1]):
            one(gib, tmp)
