"""`cudapool exporter` on a GPU (issue 24): a PyTorch training run under cudapool (a 6 GiB limit)
scraped while it runs, its figures beside torch.cuda's and nvidia-smi's. PyTorch keeps its own
cache here, so that torch.cuda.memory_reserved() is what PyTorch asked cudapool for (with its
cache off, torch.cuda.memory_allocated() reads 0: it tracks nothing).

    python3 tests/gpu/exporter_check.py CUDAPOOL_BINARY LIBCUDAPOOL

The training pauses after each phase and writes what torch.cuda says then; the scrape is taken
during the pause. Prints a table and "exporter check ok" when cudapool's allocated is
torch.cuda.memory_reserved() (up to 5% more: libraries' own allocations), nvidia-smi's figure
is at least cudapool's reserved, and the run's series are gone once it exits.
"""
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

CLI, LIB = sys.argv[1:3]
MIB = 1 << 20

TRAIN = r"""
import sys, time, torch
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True)
model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=6), torch.nn.Linear(1024, 1000)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for phase in range(3):
    for _ in range(4):
        x = torch.randn(32, 256, 1024, device="cuda")
        y = torch.randint(0, 1000, (32, 256), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 1000), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    keep = [loss]  # the loss of the last step stays allocated through the pause
    print(f"phase {phase} torch_reserved={torch.cuda.memory_reserved()} torch_allocated={torch.cuda.memory_allocated()} loss={loss.item():.4f}", flush=True)
    time.sleep(2.5)
"""


def scrape(url):
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for line in body.splitlines():
        m = re.match(r'(cudapool_[a-z_]+)\{([^}]*)\} (\S+)', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out.setdefault(labels.get("pid"), {})[m.group(1)] = (float(m.group(3)), labels)
    return out


def smi(pid):
    r = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True,
    )
    for line in r.stdout.splitlines():
        p, mib = [x.strip() for x in line.split(",")]
        if p == str(pid):
            return int(mib)
    return None


try:
    import torch  # noqa: F401  (only to say early that the check cannot run)
except ImportError:
    sys.exit("exporter check: PyTorch is not installed here (pip install torch): not run")

exp = subprocess.Popen([CLI, "exporter", "--listen", "127.0.0.1:0", "--interval", "0"], stderr=subprocess.PIPE, text=True)
script = None
train = None
try:
    url = re.search(r"http://\S+/metrics", exp.stderr.readline()).group(0)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(TRAIN)
        script = f.name
    env = dict(os.environ, LD_PRELOAD=LIB, CUDAPOOL_MEMORY_LIMIT="6GiB")
    env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    train = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE, text=True, env=env)
    ok = True
    labels = {}
    print("| phase | torch.cuda.memory_allocated | torch.cuda.memory_reserved | cudapool allocated | cudapool reserved | cudapool limit | nvidia-smi (process) | OOMs | alloc calls | cache hits |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for line in train.stdout:
        m = re.match(r"phase (\d+) torch_reserved=(\d+) torch_allocated=(\d+)", line)
        if not m:
            continue
        time.sleep(0.5)  # the page is refreshed within 50 ms
        fig = scrape(url).get(str(train.pid), {})
        get = lambda k: fig.get(k, (float("nan"), {}))[0]
        used = smi(train.pid)
        torch_reserved, torch_alloc = int(m.group(2)), int(m.group(3))
        print(
            f"| {m.group(1)} | {torch_alloc / MIB:.1f} MiB | {torch_reserved / MIB:.1f} MiB | {get('cudapool_allocated_bytes') / MIB:.1f} MiB | "
            f"{get('cudapool_reserved_bytes') / MIB:.1f} MiB | {get('cudapool_hard_limit_bytes') / MIB:.0f} MiB | "
            f"{used} MiB | {get('cudapool_ooms_total'):.0f} | {get('cudapool_alloc_calls_total'):.0f} | {get('cudapool_cache_hits_total'):.0f} |",
            flush=True,
        )
        labels = fig.get("cudapool_allocated_bytes", (0, {}))[1]
        # cudapool sees every allocation of the process (libraries' own included), torch its own.
        ok &= torch_reserved <= get("cudapool_allocated_bytes") <= torch_reserved * 1.05 + MIB
        ok &= used is not None and used * MIB >= get("cudapool_reserved_bytes")
    print("labels:", labels)
    train.wait()
    time.sleep(0.2)
    gone = str(train.pid) not in scrape(url)
    print("after the run exited, its series are gone:", gone)
    print("exporter check ok" if ok and gone and train.returncode == 0 else "exporter check FAILED")
finally:
    # Whatever happened: no exporter or training left running, no file left behind.
    for p in (train, exp):
        if p is not None and p.poll() is None:
            p.kill()
    if script:
        os.unlink(script)
