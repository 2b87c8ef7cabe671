"""Giving back what the program gives back (docs/design.md, Giving back), seen from another
process: each scenario runs without cudapool, under cudapool's defaults and under
CUDAPOOL_CACHE_IDLE=never, and nvidia-smi (a process of its own) reads the scenario's GPU
memory at each step. Prints one row per step and a PASS/FAIL line per check.

  python3 tests/gpu/give_back/check.py LIB

GIVE_BACK_SIDES (a comma list of without, default, never, limit; all by default) and
GIVE_BACK_GROUP=0 (no torch-group) split the check: the default side's agreement of cuMemGetInfo
with nvidia-smi reads the whole GPU and needs it quiet; every other figure is the process's own
(nvidia-smi by pid, or a limit far below what the GPU has), so it holds beside other work.

Under an 8 GiB limit too: the process's figure as without cudapool, and what it is told is free
never more than the GPU has free (what it is told it can have). A group member (torch-group)
says at each step what its group's ledger records; nvidia-smi's figure for the process should
pass it by no more than the mandatory mode's allowance for a process (src/limits/group/
witness.rs: 128 MiB), which an honest job must never meet.

Scenarios (a child process each; it says a step, then waits for the parent to read):
  torch-on   PyTorch's cache on: a 1 GiB tensor; del + torch.cuda.empty_cache(); a new 512 MiB
  torch-off  PYTORCH_NO_CUDA_MEMORY_CACHING=1: 300 steps of tensors made and freed (256 MiB
             stay live), then idle for 4 s
  cupy       CuPy's pool: a 1 GiB array; del + free_all_blocks()
  torch-group  in a group of 40 GiB: a 1 GiB tensor, a matmul (cuBLAS's workspace), a
             convolution (cuDNN), del + empty_cache(); each step with the ledger's figure
"""
import os
import subprocess
import sys
import time

LIB = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else None
MIB = 1 << 20
# The GPU the scenarios run on, as nvidia-smi names it: the first of CUDA_VISIBLE_DEVICES (an
# index or a UUID; nvidia-smi -i takes both), so that a half of the suite run on the second GPU
# reads its own.
GPU = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"

CHILD = r'''
import os, sys
def step(name, free=None):
    extra = "" if free is None else " free=%d" % free
    if os.environ.get("CUDAPOOL_GROUP"):
        import cudapool
        extra += " ledger=%d" % cudapool.group_stats(0)["reserved_bytes"]
    print("step %s%s" % (name, extra), flush=True)
    sys.stdin.readline()
what = sys.argv[1]
if what == "torch-group":
    import torch
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    info = lambda: torch.cuda.mem_get_info()[0]
    step("start", info())
    x = torch.empty(1 << 30, dtype=torch.int8, device="cuda"); torch.cuda.synchronize()
    step("holding 1 GiB", info())
    a = torch.randn(4096, 4096, device="cuda"); b = a @ a; torch.cuda.synchronize()
    step("after a matmul", info())
    c = torch.nn.functional.conv2d(torch.randn(16, 64, 128, 128, device="cuda"), torch.randn(64, 64, 3, 3, device="cuda"))
    torch.cuda.synchronize()
    step("after a convolution", info())
    del x, a, b, c; torch.cuda.empty_cache()
    step("after empty_cache", info())
elif what.startswith("torch"):
    import torch
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    info = lambda: torch.cuda.mem_get_info()[0]
    step("start", info())
    if what == "torch-on":
        x = torch.empty(1 << 30, dtype=torch.int8, device="cuda"); torch.cuda.synchronize()
        step("holding 1 GiB", info())
        del x; torch.cuda.empty_cache()
        step("after empty_cache", info())
        y = torch.empty(512 << 20, dtype=torch.int8, device="cuda"); torch.cuda.synchronize()
        step("a new 512 MiB", info())
    else:
        keep = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
        for i in range(300):
            t = [torch.empty((1 + (i * 7 + k) % 13) << 20, dtype=torch.int8, device="cuda") for k in range(8)]
            s = sum(float(a.sum()) for a in t[:1])
            del t
        torch.cuda.synchronize()
        step("churned, 256 MiB live", info())
        import time; time.sleep(4)
        step("idle 4 s", info())
else:
    import cupy
    a = cupy.empty(1 << 30, dtype=cupy.int8); cupy.cuda.runtime.deviceSynchronize()
    step("holding 1 GiB", cupy.cuda.runtime.memGetInfo()[0])
    del a; cupy.get_default_memory_pool().free_all_blocks()
    step("after free_all_blocks", cupy.cuda.runtime.memGetInfo()[0])
'''


def smi(pid):
    """(this process's MiB, the device's free MiB), read by nvidia-smi."""
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    mine = sum(int(u) for p, u in (l.split(", ") for l in apps.strip().splitlines() if l) if int(p) == pid)
    free = int(subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits",
                               "-i", GPU], capture_output=True, text=True).stdout.split()[0])
    return mine, free


def run(scenario, env):
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    e.update(env)
    if scenario == "torch-off":
        e["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    p = subprocess.Popen([sys.executable, "-c", CHILD, scenario], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=e)
    rows = []
    for line in p.stdout:
        if not line.startswith("step "):
            continue
        parts = line.split()
        kv = dict(w.split("=", 1) for w in parts[1:] if "=" in w)
        free_api = int(kv["free"]) // MIB
        name = " ".join(w for w in parts[1:] if "=" not in w)
        mine, free_smi = smi(p.pid)
        row = (name, mine, free_api, free_smi)
        if "ledger" in kv:
            row += (int(kv["ledger"]) / MIB,)
        rows.append(row)
        p.stdin.write("\n")
        p.stdin.flush()
    p.wait()
    return rows


def main():
    sides = [("without", {})]
    if LIB:
        sides += [("default", {"LD_PRELOAD": LIB}),
                  ("never", {"LD_PRELOAD": LIB, "CUDAPOOL_CACHE_IDLE": "never"}),
                  ("limit", {"LD_PRELOAD": LIB, "CUDAPOOL_MEMORY_LIMIT": "8GiB"})]
    wanted = os.environ.get("GIVE_BACK_SIDES")
    if wanted:
        names = set(wanted.split(",")) | {"without"}
        sides = [(n, e) for n, e in sides if n in names]
    ok = True
    if LIB and os.environ.get("GIVE_BACK_GROUP", "1") != "0":
        ok &= group_gap()
    for scenario in ["torch-on", "torch-off", "cupy"]:
        got = {side: run(scenario, env) for side, env in sides}
        print(f"--- {scenario}: the process's MiB by nvidia-smi (cuMemGetInfo free - nvidia-smi free, MiB)")
        print("step | " + " | ".join(s for s, _ in sides))
        base = got["without"]
        for i, (name, *_r) in enumerate(base):
            cells = []
            for side, _ in sides:
                if i < len(got[side]):
                    _, mine, fa, fs = got[side][i]
                    cells.append(f"{mine} ({fa - fs:+d})")
                else:
                    cells.append("-")
            print(f"{name} | " + " | ".join(cells))
        if not LIB:
            continue
        d = got.get("default", base)
        if "default" in got and len(d) != len(base):
            print(f"FAIL | give-back {scenario} | the scenario ended early under cudapool")
            ok = False
            continue
        # The steps after a program gave memory back: within one granule (2 MiB) of the
        # figure without cudapool; what the process is told is free agrees with nvidia-smi
        # as it does without cudapool (2 MiB).
        for i, (name, mine, fa, fs) in enumerate(d if "default" in got else []):
            if not ("after" in name or "idle" in name or "new" in name):
                continue
            extra = mine - base[i][1]
            skew = (fa - fs) - (base[i][2] - base[i][3])
            good = extra <= 2 and abs(skew) <= 2
            ok &= good
            print(f"{'PASS' if good else 'FAIL'} | give-back {scenario}, {name} | "
                  f"{mine} MiB against {base[i][1]} without cudapool ({extra:+d}); "
                  f"cuMemGetInfo agrees with nvidia-smi to {skew:+d} MiB of the figure without cudapool")
        # Under a limit: given back as without it, and told no more free than the GPU has.
        if "limit" not in got:
            continue
        lim = got["limit"]
        if len(lim) != len(base):
            print(f"FAIL | give-back {scenario}, under an 8 GiB limit | the scenario ended early")
            ok = False
            continue
        for i, (name, mine, fa, fs) in enumerate(lim):
            if not ("after" in name or "idle" in name or "new" in name):
                continue
            extra = mine - base[i][1]
            good = extra <= 2 and fa <= fs + 2
            ok &= good
            print(f"{'PASS' if good else 'FAIL'} | give-back {scenario}, {name}, under an 8 GiB limit | "
                  f"{mine} MiB against {base[i][1]} without cudapool ({extra:+d}); told {fa} MiB free, "
                  f"the GPU has {fs}")
    sys.exit(0 if ok else 1)


def group_gap():
    """nvidia-smi's figure for a group member against what the group's ledger records, at each
    step: the gap the mandatory mode's witness allows (a 64th of the share, at least 2 MiB)."""
    cb = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "cbindings", "python")
    env = {"LD_PRELOAD": LIB, "CUDAPOOL_GROUP": "gap-%d" % os.getpid(), "CUDAPOOL_GROUP_LIMIT": "40GiB",
           "PYTHONPATH": os.path.abspath(cb)}
    rows = run("torch-group", env)
    # The witness allows 128 MiB a process beyond what the ledger counts (witness.rs PER_PROCESS).
    slack = 128
    print("--- torch-group: nvidia-smi's MiB for the process, the ledger's MiB, the gap")
    worst = 0.0
    for name, mine, _fa, _fs, *ledger in rows:
        led = ledger[0] if ledger else float("nan")
        gap = mine - led
        worst = max(worst, gap)
        print(f"{name} | {mine} | {led:.1f} | {gap:+.1f}")
    good = len(rows) == 5 and worst <= slack
    print(f"{'PASS' if good else 'FAIL'} | witness slack: nvidia-smi above the ledger by at most "
          f"{worst:+.1f} MiB over {len(rows)} steps (the witness allows {slack} MiB a process)")
    return good


if __name__ == "__main__":
    main()
