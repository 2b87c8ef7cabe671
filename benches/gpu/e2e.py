"""The job benchmark (issue 36): whole jobs, rows interleaved in rounds, each row's speed as a
ratio to PyTorch's own allocator *in the same round*, reported as the median and interquartile
range over the rounds, beside peak GPU memory by nvidia-smi and by the allocator.

usage: python3 benches/gpu/e2e.py [--jobs gpt,cnn,gen,small] [--rounds 10] [--seconds 3]
                                  [--lib target/release/libcudapool.so] [--out FILE]
       E2E_CPUS=2,3 pins every worker to those cores (the same for all rows).

Each row of a job is one worker process, started once and kept (so a round measures steps, not
start-up): the driver tells the workers in turn (A, B, C, ..., A, B, C, ...) to run a round of
the same number of steps (what PyTorch's own row did in --seconds in the warm-up round, so
that every row of `gen` sees the same sequence of shapes), and each answers with its wall time
and GPU time (CUDA events around the round). nvidia-smi's figure for the worker is sampled
while it runs. The first round (--seconds of steps each) is the warm-up and is not counted.

Jobs (the models of train_mem.py):
  gpt    a 6-layer GPT-style decoder (d 768, vocab 16384), batch 16 x 512, AdamW
  cnn    ResNet-50, batch 64 at 224x224, bf16 autocast, channels_last, SGD momentum
  gen    GPT-2 (12 layers, random weights) generating 32 tokens for 1 to 8 prompts of 16 to
         128 tokens (changing shapes)
  small  a CPU-bound job: a 16-layer MLP of width 64, batch 8, Adam without foreach (hundreds
         of tiny kernels a step: the per-launch cost shows)
Rows:
  torch      PyTorch's own caching allocator
  torch-again  the same again, in a worker of its own (an A/A row: the host's noise alone)
  torch-exp  PyTorch's, expandable_segments:True
  cp-limit   PyTorch's cache on, cudapool preloaded with a 70 GiB limit (limit-only use)
  cp-split   PyTorch's cache off (PYTORCH_NO_CUDA_MEMORY_CACHING=1), cudapool split, classic
  cp-exp     PyTorch's cache off, cudapool split, expandable segments
Diagnostic rows, run only when --rows names them:
  cp-imm     cp-split with CUDAPOOL_REUSE=immediate (no fences: what reuse safety costs)
  cp-off     cudapool preloaded with CUDAPOOL_DISABLE=1 (what loading alone costs)
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")

ROWS = {
    "torch": {},
    # The same as torch, in a worker of its own: what the host's noise alone does to a ratio.
    "torch-again": {},
    "torch-exp": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cp-limit": {"LD_PRELOAD": "LIB", "CUDAPOOL_MEMORY_LIMIT": "70GiB"},
    "cp-split": {"LD_PRELOAD": "LIB", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDAPOOL_SEGMENTS": "classic"},
    "cp-exp": {"LD_PRELOAD": "LIB", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDAPOOL_SEGMENTS": "expandable"},
    # Diagnostic rows (not run unless named in --rows).
    "cp-imm": {"LD_PRELOAD": "LIB", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDAPOOL_SEGMENTS": "classic", "CUDAPOOL_REUSE": "immediate"},
    "cp-off": {"LD_PRELOAD": "LIB", "CUDAPOOL_DISABLE": "1"},
}
DEFAULT_ROWS = ["torch", "torch-again", "torch-exp", "cp-limit", "cp-split", "cp-exp"]


# ---- the worker: one job under one row ------------------------------------------------------
def worker(job):
    cpus = os.environ.get("E2E_CPUS")
    if cpus:
        # Every row on the same cores: rows compared within a round share their caches' and
        # clocks' state, and no row gets a quieter core by chance.
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    import torch

    sys.path.insert(0, os.path.join(ROOT, "cbindings", "python"))
    import cudapool

    torch.manual_seed(0)
    if job in ("gpt", "cnn", "gen"):
        step = _train_mem_step(job)
    else:
        layers = []
        for _ in range(16):
            layers += [torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)]
        model = torch.nn.Sequential(*layers).cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)

        def step():
            x = torch.randn(8, 64, device="cuda")
            loss = model(x).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss

    pooled = cudapool.is_loaded() and os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] in ("round", "steps"):
            # "round S": at least S seconds of steps (the warm-up); "steps N": N steps.
            seconds = float(cmd[1]) if cmd[0] == "round" else float("inf")
            count = int(cmd[1]) if cmd[0] == "steps" else None
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            steps = 0
            times = []
            t = t0
            while True:
                step()
                steps += 1
                now = time.perf_counter()
                times.append(now - t)
                t = now
                if steps == count or now - t0 >= seconds:
                    break
            end.record()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            # The median step as the host sees it (no sync per step: the job runs as it would):
            # a step an interrupt or another tenant stretched does not move it.
            print(json.dumps({"steps": steps, "wall": wall, "gpu": start.elapsed_time(end) / 1e3,
                              "step_median": statistics.median(times)}), flush=True)
        elif cmd[0] == "peak":
            if pooled:
                peak = cudapool.max_memory_reserved(0)
            else:
                peak = torch.cuda.max_memory_reserved(0)
            print(json.dumps({"peak_reserved": peak, "source": "cudapool" if pooled else "torch"}), flush=True)
            return


def _train_mem_step(job):
    """The step of train_mem.py's job, built the way it builds it."""
    import importlib.util

    argv = sys.argv
    sys.argv = ["train_mem.py", job, "--steps", "0", "--warmup", "0"]
    spec = importlib.util.spec_from_file_location("train_mem_job", os.path.join(HERE, "train_mem.py"))
    # Imported (not run as a script), train_mem.py builds its job and does not run it.
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.argv = argv
    return mod.step


# ---- the driver --------------------------------------------------------------------------------
def smi_used():
    """pid -> MiB, from nvidia-smi (not under cudapool: the real figures)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
        ).stdout
    except Exception:  # noqa: BLE001
        return {}
    used = {}
    for line in out.splitlines():
        a = [x.strip() for x in line.split(",")]
        if len(a) == 2 and a[0].isdigit() and a[1].isdigit():
            used[int(a[0])] = int(a[1])
    return used


class Worker:
    def __init__(self, job, row, lib):
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        for k, v in ROWS[row].items():
            env[k] = lib if v == "LIB" else v
        self.row = row
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", job], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if os.environ.get("E2E_QUIET") else None,
                                  text=True, env=env)
        self.smi_peak = 0

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline()
        if not out:
            raise RuntimeError(f"worker {self.row} died")
        return json.loads(out)


def quartiles(xs):
    xs = sorted(xs)
    if len(xs) < 4:
        return xs[0], statistics.median(xs), xs[-1]
    q = statistics.quantiles(xs, n=4)
    return q[0], q[1], q[2]


def run_job(job, rounds, seconds, lib, rows):
    workers = [Worker(job, r, lib) for r in rows]
    for w in workers:
        w.pid = json.loads(w.p.stdout.readline())["ready"]
    res = {w.row: [] for w in workers}
    order = list(workers)
    n = 0
    for rnd in range(rounds + 1):
        # The rows in turn; the order rotates each round so that no row always follows another.
        k = rnd % len(order)
        if rnd == 0:
            k = 0  # torch first: its warm-up sets the round's steps
        for w in order[k:] + order[:k]:
            stop = threading.Event()

            def sample(w=w, stop=stop):
                while not stop.is_set():
                    m = smi_used().get(w.pid)
                    if m:
                        w.smi_peak = max(w.smi_peak, m)
                    stop.wait(0.25)

            t = threading.Thread(target=sample)
            t.start()
            r = w.ask(f"round {seconds}" if rnd == 0 else f"steps {n}")
            if rnd == 0 and w.row == "torch":
                n = max(2, round(r["steps"] / r["wall"] * seconds))
            stop.set()
            t.join()
            if rnd > 0:
                res[w.row].append(r)
        print(f"  {job} round {rnd}: " + " ".join(f"{w.row}={res[w.row][-1]['steps'] / res[w.row][-1]['wall']:.2f}"
                                                      for w in workers if rnd > 0), flush=True)
    peaks = {w.row: w.ask("peak") for w in workers}
    for w in workers:
        w.p.wait(timeout=60)
    table = []
    base = [r["steps"] / r["wall"] for r in res["torch"]]
    base_step = [r["step_median"] for r in res["torch"]]
    base_gpu = [r["steps"] / r["gpu"] for r in res["torch"]]
    for w in workers:
        sps = [r["steps"] / r["wall"] for r in res[w.row]]
        gps = [r["steps"] / r["gpu"] for r in res[w.row]]
        ratio = [a / b for a, b in zip(sps, base)]
        sratio = [b / r["step_median"] for r, b in zip(res[w.row], base_step)]
        gratio = [a / b for a, b in zip(gps, base_gpu)]
        table.append({
            "job": job, "row": w.row,
            "steps_per_s": statistics.median(sps),
            "ms_per_step_wall": 1e3 / statistics.median(sps),
            "ms_per_step_gpu": 1e3 / statistics.median(gps),
            "ratio_q": quartiles(ratio), "gpu_ratio_q": quartiles(gratio), "step_ratio_q": quartiles(sratio),
            "ms_per_step_median": 1e3 * statistics.median(r["step_median"] for r in res[w.row]),
            "smi_peak_mib": w.smi_peak,
            "alloc_peak_mib": peaks[w.row]["peak_reserved"] / 2**20, "alloc_source": peaks[w.row]["source"],
        })
    return table


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default="gpt,cnn,gen,small")
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--lib", default=os.path.join(ROOT, "target", "release", "libcudapool.so"))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    lib = os.path.abspath(a.lib)
    rows = a.rows.split(",")
    assert rows[0] == "torch", "the first row is the reference: torch"
    all_rows = []
    for job in a.jobs.split(","):
        print(f"== {job}: {a.rounds} rounds of {a.seconds} s, rows {', '.join(rows)}", flush=True)
        all_rows += run_job(job, a.rounds, a.seconds, lib, rows)
    print()
    print("| job | row | ms/step wall | ms/step GPU | median step ms | speed vs torch (wall), median [IQR] | speed vs torch (median step) | GPU-time speed vs torch | nvidia-smi peak MiB | allocator peak MiB |")
    print("| --- | --- | ---: | ---: | ---: | --- | --- | --- | ---: | ---: |")

    def q(t, key):
        lo, med, hi = t[key]
        verdict = "" if t["row"] == "torch" else (" (none)" if lo <= 1.0 <= hi else "")
        return f"{med:.3f} [{lo:.3f}, {hi:.3f}]{verdict}"

    for t in all_rows:
        print(f"| {t['job']} | {t['row']} | {t['ms_per_step_wall']:.2f} | {t['ms_per_step_gpu']:.2f} | {t['ms_per_step_median']:.2f} | "
              f"{q(t, 'ratio_q')} | {q(t, 'step_ratio_q')} | {q(t, 'gpu_ratio_q')} | {t['smi_peak_mib']} | "
              f"{t['alloc_peak_mib']:.0f} ({t['alloc_source']}) |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(all_rows, f, indent=1)


if __name__ == "__main__":
    random.seed(0)
    main()
