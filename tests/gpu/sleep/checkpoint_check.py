"""The driver's checkpoint, as root's arbiter uses it for a process that does not put itself to
sleep (docs/design.md, "Overcommit: root's arbiter"), seen by nvidia-smi: a PyTorch process
that holds 4 GiB and reads one element every 20 ms (device work) is checkpointed from outside
with `cudapool slurm checkpoint PID`, then restored with `--restore`.

  python3 tests/gpu/sleep/checkpoint_check.py LIB CLI

For a process under cudapool (its pool's expandable arena: reserved ranges, mapped handles)
and for one without: what nvidia-smi shows for it before, checkpointed and restored; whether
its device work stood still while checkpointed (its loop counts its reads into a file); how
long each step took; the tensor's checksum after. Prints one PASS/FAIL/SKIP row per process.
A SKIP row says why (not root; a driver without the checkpoint API).
"""
import os
import subprocess
import sys
import tempfile
import time

LIB = os.path.abspath(sys.argv[1])
CLI = os.path.abspath(sys.argv[2])
GPU = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"

CHILD = r'''
import os, sys, torch
go, beat = sys.argv[1], sys.argv[2]
x = torch.arange(1 << 30, dtype=torch.int32, device="cuda")  # 4 GiB
want = int(x.double().sum().item())
print("ready", flush=True)
n = 0
while not os.path.exists(go):
    x[12345].item()
    n += 1
    with open(beat, "w") as f:
        f.write(str(n))
    import time; time.sleep(0.02)
print("intact=%d" % (int(x.double().sum().item()) == want), flush=True)
'''


def smi(pid):
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                           "--format=csv,noheader,nounits", "-i", GPU],
                          capture_output=True, text=True).stdout
    return sum(int(u) for p, u in (l.split(", ") for l in apps.strip().splitlines() if l)
               if int(p) == pid)


def beats(path):
    try:
        with open(path) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return -1


def cli(*args):
    r = subprocess.run([CLI, "slurm", "checkpoint", *args], capture_output=True, text=True,
                       timeout=120)
    return r.returncode, (r.stdout + r.stderr).strip()


def one(tmp, name, env):
    go, beat = os.path.join(tmp, f"go-{name}"), os.path.join(tmp, f"beat-{name}")
    e = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    e.update(env)
    p = subprocess.Popen([sys.executable, "-c", CHILD, go, beat], stdout=subprocess.PIPE,
                         text=True, env=e)
    for line in p.stdout:
        if line.strip() == "ready":
            break
    time.sleep(0.5)
    before = smi(p.pid)
    rc, said = cli(str(p.pid))
    if rc != 0:
        open(go, "w").close()
        p.wait()
        skip = "checkpoint API" in said or "root" in said
        print(f"{'SKIP' if skip else 'FAIL'} | checkpoint by the driver: {name} | {said}", flush=True)
        return
    time.sleep(0.5)
    held = smi(p.pid)
    b0 = beats(beat)
    time.sleep(1.0)
    still = beats(beat) == b0
    rc2, said2 = cli(str(p.pid), "--restore")
    time.sleep(0.5)
    after = smi(p.pid)
    b1 = beats(beat)
    time.sleep(0.5)
    moving = beats(beat) > b1
    open(go, "w").close()
    out = p.stdout.read()
    p.wait()
    intact = "intact=1" in out
    good = rc2 == 0 and held < before - 4000 and still and after >= before - 64 and moving and intact
    print(f"{'PASS' if good else 'FAIL'} | checkpoint by the driver: {name} | "
          f"nvidia-smi {before} MiB, checkpointed {held} MiB ({said}); work stood still: {still}; "
          f"restored {after} MiB ({said2}); work goes on: {moving}; intact={int(intact)}", flush=True)


def main():
    if os.geteuid() != 0:
        print("SKIP | checkpoint by the driver | not root (the arbiter and the command are root's)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        one(tmp, "a PyTorch process under cudapool", {"LD_PRELOAD": LIB, "CUDAPOOL_CACHE_IDLE": "never"})
        one(tmp, "a PyTorch process without cudapool", {})


main()
