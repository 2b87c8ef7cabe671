"""The moment of OOM with PyTorch under cudapool (issue 35), on a GPU: with
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync cudapool pools every tensor and an allocation
past a 2 GiB limit raises torch.OutOfMemoryError; CUDAPOOL_OOM_SNAPSHOT's file opens in
torch.cuda._memory_viz (its segment and trace plots render). Prints PASS/FAIL lines and
"oom check: N passed, M failed".

    python3 tests/gpu/oom_check.py LIB OUTDIR
"""
import glob
import os
import subprocess
import sys

lib, outdir = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
os.makedirs(outdir, exist_ok=True)
child = r'''
import torch
held = []
try:
    while True:
        held.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except Exception as e:
    print("caught", type(e).__module__ + "." + type(e).__name__, "after", len(held), "tensors of 256 MiB")
'''
env = dict(os.environ, LD_PRELOAD=lib, CUDAPOOL_MEMORY_LIMIT="2GiB",
           PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync",
           CUDAPOOL_OOM_SNAPSHOT=os.path.join(outdir, "oom-%p-%n.pickle"))
p = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300)
print(p.stdout.strip())
print(p.stderr.strip()[-600:])
passed = failed = 0


def check(what, ok, detail=""):
    global passed, failed
    passed, failed = passed + ok, failed + (not ok)
    print("PASS" if ok else "FAIL", what, detail)


check("a PyTorch OOM under cudapool is torch.OutOfMemoryError (backend:cudaMallocAsync)",
      "caught torch.OutOfMemoryError" in p.stdout, p.stdout.strip())
check("the OOM line names the snapshot", "snapshot of this moment in" in p.stderr)
snaps = sorted(glob.glob(os.path.join(outdir, "oom-*.pickle")))
ok = False
if snaps:
    import pickle
    from torch.cuda import _memory_viz
    with open(snaps[0], "rb") as f:
        d = pickle.load(f)
    html1 = _memory_viz.segment_plot(d)
    html2 = _memory_viz.trace_plot(d)
    with open(os.path.join(outdir, "oom_segment_plot.html"), "w") as f:
        f.write(html1)
    ok = len(html1) > 1000 and len(html2) > 1000 and any(e["action"] == "oom" for e in d["device_traces"][0])
    print("snapshot", snaps[0], "segments", len(d["segments"]), "events", len(d["device_traces"][0]))
check("the OOM snapshot renders in torch.cuda._memory_viz, with the OOM in its trace", ok, snaps[:1])
print(f"oom check: {passed} passed, {failed} failed")
