"""A shared GPU where the idle sleep before anyone is refused (CUDAPOOL_SLEEP_IDLE): two PyTorch
processes in one cudapool group whose limit holds 1.5 times what one needs. A allocates its
tensors, trains a little and goes idle; B then needs as much. Without CUDAPOOL_SLEEP_IDLE, B gets
torch.OutOfMemoryError; with it, A is put to sleep and B runs with no OOM. Then A works again:
it waits for room until B ends, and finishes with its tensors intact.

    python3 sleep_group.py LIB WORKDIR
Prints "row ..." lines and "sleep group ok" when all held.
"""
import os
import subprocess
import sys
import time

LIB, W = sys.argv[1], sys.argv[2]
os.makedirs(W, exist_ok=True)
NEED_GIB = 6

A = r"""
import sys, time, torch, cudapool
x = torch.randn(int(NEED) << 28, device="cuda")  # NEED GiB of float32
ref = x.sum().item()
print("a ready", flush=True)
sys.stdin.readline()                              # idle until told
t = time.time()
got = x.sum().item()                              # wakes it (waiting for room if need be)
print(f"a same={int(got == ref)} woke_s={time.time() - t:.2f}", flush=True)
""".replace("NEED", str(NEED_GIB))

B = r"""
import torch
try:
    y = torch.randn(int(NEED) << 28, device="cuda")
    print(f"b ok sum={y.sum().item():.1f}", flush=True)
except torch.OutOfMemoryError as e:
    print("b oom", flush=True)
""".replace("NEED", str(NEED_GIB))


def run(idle):
    group = f"sleepgrp{os.getpid()}{idle}"
    env = dict(os.environ, LD_PRELOAD=LIB, CUDAPOOL_GROUP=group,
               CUDAPOOL_GROUP_LIMIT=f"{int(NEED_GIB * 1.5 * 1024)}MiB", CUDAPOOL_WAKE_TIMEOUT="0")
    a = subprocess.Popen([sys.executable, "-c", A], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert a.stdout.readline().strip() == "a ready"
    time.sleep(3)  # A idle
    benv = dict(env)
    if idle:
        benv["CUDAPOOL_SLEEP_IDLE"] = "2s"
    b = subprocess.run([sys.executable, "-c", B], env=benv, capture_output=True, text=True,
                       timeout=300)
    a.stdin.write("go\n")
    a.stdin.flush()
    out, _ = a.communicate(timeout=300)
    bline = (b.stdout.strip().splitlines() or ["b nothing: " + b.stderr[-200:]])[-1]
    return bline, out.strip()


ok = True
bline, aline = run(False)
print(f"row without CUDAPOOL_SLEEP_IDLE: {bline} | {aline}")
ok &= bline == "b oom"
bline, aline = run(True)
print(f"row with CUDAPOOL_SLEEP_IDLE=2s: {bline} | {aline}")
ok &= bline.startswith("b ok") and "a same=1" in aline
print("sleep group ok" if ok else "sleep group FAILED")
