"""The model benchmark (issue 45): training jobs built from classes nobody here wrote (HF
transformers' GPT-2, BERT, T5, Llama and ViT, torchvision's ResNet-50; random weights, no
download), each row a worker process of its own, rows interleaved in rounds, each row's speed a
ratio to PyTorch's own allocator in the same round (median and interquartile range), beside
the whole process's peak GPU memory and the host CPU time a step costs.

usage: python3 benches/gpu/models.py [--jobs gpt2,bert,t5,llama,vit,resnet50]
           [--rows torch,torch-again,torch-exp,cp,cp-pooled] [--rounds 8] [--seconds 2]
           [--lib target/release/libcudapool.so] [--out FILE.json]

Rows:
  torch        PyTorch's own caching allocator (the reference)
  torch-again  the same, in another worker (A/A: the host's noise alone)
  torch-exp    PyTorch's own, expandable_segments:True (its leanest)
  cp           cudapool's default: PyTorch's cache off (PYTORCH_NO_CUDA_MEMORY_CACHING=1),
               cudapool serves every tensor (split pool, expandable segments)
  cp-pooled    the pooled mode: PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, cudapool
               serves every tensor through the stream-ordered API
  cp-classic   diagnostic: cp with CUDAPOOL_SEGMENTS=classic (only when --rows names it)
  cp-stitch    experiment: cp with CUDAPOOL_STITCH=always (stitching at every growth)
  torch-async  diagnostic: PyTorch's backend:cudaMallocAsync alone (the driver's pool)
  cp-base, cp-pooled-base  diagnostic: cp and cp-pooled with the library $MODELS_BASE_LIB
               names (two builds side by side)

Peak memory is the whole process's device memory at its peak, as nvidia-smi would count it:
the allocator's own peak reserved bytes (exact: cudapool's, or torch.cuda.max_memory_reserved)
plus what the process holds outside the allocator (context, kernels, libraries' own buffers:
NVML's per-process figure at the end less the allocator's reserved bytes then, constant once
the job runs). A thread of this driver process also reads NVML's per-process figure every 2 ms
while the worker runs, every round (the warm-up included): the sampled peak, printed beside as
a check, never above the exact one by more than NVML's own rounding.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from e2e import quartiles  # the job benchmark's spread: [25th, median, 75th]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

ROWS = {
    "torch": {},
    "torch-again": {},
    "torch-exp": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cp": {"LD_PRELOAD": "LIB", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
    "cp-pooled": {"LD_PRELOAD": "LIB", "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    "cp-classic": {"LD_PRELOAD": "LIB", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDAPOOL_SEGMENTS": "classic"},
    "cp-stitch": {"LD_PRELOAD": "LIB", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDAPOOL_STITCH": "always"},
    "torch-async": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    # A/B of two builds: the rows of cp and cp-pooled with the library MODELS_BASE_LIB names.
    "cp-base": {"LD_PRELOAD": "BASE", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
    "cp-pooled-base": {"LD_PRELOAD": "BASE", "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
}
DEFAULT_ROWS = ["torch", "torch-again", "torch-exp", "cp", "cp-pooled"]
JOBS = ["gpt2", "bert", "t5", "llama", "vit", "resnet50"]


# ---- the jobs ----------------------------------------------------------------------------------
def build(job):
    """The model, its optimizer and one training step of `job`."""
    import torch

    torch.manual_seed(0)
    bf16 = torch.autocast("cuda", dtype=torch.bfloat16)
    if job == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=512)
        model = GPT2LMHeadModel(cfg).cuda()

        def loss():
            x = torch.randint(0, cfg.vocab_size, (8, 512), device="cuda")
            return model(input_ids=x, labels=x).loss

        amp = None
    elif job == "bert":
        from transformers import BertConfig, BertForMaskedLM

        cfg = BertConfig()
        model = BertForMaskedLM(cfg).cuda()

        def loss():
            x = torch.randint(0, cfg.vocab_size, (16, 512), device="cuda")
            return model(input_ids=x, labels=x).loss

        amp = bf16
    elif job == "t5":
        from transformers import T5Config, T5ForConditionalGeneration

        cfg = T5Config(d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
                       decoder_start_token_id=0, pad_token_id=0)
        model = T5ForConditionalGeneration(cfg).cuda()

        def loss():
            src = torch.randint(0, cfg.vocab_size, (16, 512), device="cuda")
            tgt = torch.randint(0, cfg.vocab_size, (16, 128), device="cuda")
            return model(input_ids=src, labels=tgt).loss

        amp = bf16
    elif job == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                          num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                          max_position_embeddings=1024)
        model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16)

        def loss():
            x = torch.randint(0, cfg.vocab_size, (8, 1024), device="cuda")
            return model(input_ids=x, labels=x).loss

        amp = None
    elif job == "vit":
        from transformers import ViTConfig, ViTForImageClassification

        cfg = ViTConfig(num_labels=1000)
        model = ViTForImageClassification(cfg).cuda()

        def loss():
            x = torch.randn(64, 3, 224, 224, device="cuda")
            y = torch.randint(0, 1000, (64,), device="cuda")
            return model(pixel_values=x, labels=y).loss

        amp = bf16
    elif job == "resnet50":
        import torchvision

        model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
        ce = torch.nn.CrossEntropyLoss()

        def loss():
            x = torch.randn(64, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
            y = torch.randint(0, 1000, (64,), device="cuda")
            return ce(model(x), y)

        amp = bf16
    else:
        raise SystemExit(f"unknown job {job}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        if amp is None:
            out = loss()
        else:
            with amp:
                out = loss()
        out.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out

    return step


# ---- the worker: one job under one row ---------------------------------------------------------
def worker(job):
    import torch

    sys.path.insert(0, os.path.join(ROOT, "cbindings", "python"))
    import cudapool

    step = build(job)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] in ("round", "steps"):
            seconds = float(cmd[1]) if cmd[0] == "round" else float("inf")
            count = int(cmd[1]) if cmd[0] == "steps" else None
            torch.cuda.synchronize()
            before = cudapool.memory_stats(0) if cudapool.is_loaded() else None
            t0, c0 = time.perf_counter(), time.process_time()
            steps, slowest, t = 0, 0.0, t0
            while True:
                step()
                steps += 1
                now = time.perf_counter()
                slowest, t = max(slowest, now - t), now
                if steps == count or now - t0 >= seconds:
                    break
            torch.cuda.synchronize()
            r = {"steps": steps, "wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                 "slowest_step": slowest}
            if before is not None:
                after = cudapool.memory_stats(0)
                r["driver_allocs"] = after["driver_allocs"] - before["driver_allocs"]
                r["reserved_mib"] = after["reserved_bytes"] / 2**20
            print(json.dumps(r), flush=True)
        elif cmd[0] == "peak":
            out = {"torch_max_reserved": torch.cuda.max_memory_reserved(),
                   "torch_max_allocated": torch.cuda.max_memory_allocated(),
                   "torch_reserved": torch.cuda.memory_reserved()}
            if cudapool.is_loaded():
                s = cudapool.memory_stats(0)
                out.update(cp_max_reserved=s["peak_reserved_bytes"], cp_max_allocated=s["peak_allocated_bytes"],
                           cp_reserved=s["reserved_bytes"], cp_allocated=s["allocated_bytes"])
            if cmd[1:] and cudapool.is_loaded():
                cudapool.snapshot(cmd[1], format="torch")
                out["snapshot"] = cmd[1]
            print(json.dumps(out), flush=True)
            return


# ---- the driver: NVML's per-process figure, read in a tight loop --------------------------------
class _Proc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong),
                ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]


class Nvml:
    def __init__(self, index=0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        assert self.lib.nvmlInit_v2() == 0
        self.h = ctypes.c_void_p()
        assert self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.h)) == 0
        self.buf = (_Proc * 256)()

    def used(self):
        """pid -> bytes of every process on the GPU now."""
        n = ctypes.c_uint(256)
        if self.lib.nvmlDeviceGetComputeRunningProcesses_v3(self.h, ctypes.byref(n), self.buf) != 0:
            return {}
        return {self.buf[i].pid: self.buf[i].used for i in range(n.value)}


class Sampler:
    """Reads `pid`'s device memory as fast as NVML answers while a round runs."""

    def __init__(self, nvml, enabled=True):
        self.nvml, self.peak, self.reads, self.enabled = nvml, {}, 0, enabled

    def watch(self, pid, run):
        if not self.enabled:
            return run()
        stop = threading.Event()

        def loop():
            # Every 2 ms: NVML's per-process query takes the driver's lock that cuMemCreate and
            # cuMemMap take too; read back to back it slowed a growing pool's every call to a
            # millisecond (T5, H100). The exact peak is the allocator's plus the memory outside
            # it (see `peak_mib`); this reading checks it.
            while not stop.wait(0.002):
                m = self.nvml.used().get(pid)
                self.reads += 1
                if m:
                    self.peak[pid] = max(self.peak.get(pid, 0), m)

        t = threading.Thread(target=loop)
        t.start()
        try:
            return run()
        finally:
            stop.set()
            t.join()


class Worker:
    def __init__(self, job, row, lib):
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        for k, v in ROWS[row].items():
            env[k] = {"LIB": lib, "BASE": os.environ.get("MODELS_BASE_LIB", "")}.get(v, v)
        self.row = row
        self.log = f"/tmp/models-{job}-{row}-{os.getpid()}.log"
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", job],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                  stderr=open(self.log, "w"))
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {row} of {job} did not start:\n{self.tail()}")
        self.pid = json.loads(line)["ready"]

    def tail(self):
        with open(self.log) as f:
            return "".join(f.readlines()[-15:])

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline()
        if not out:
            raise RuntimeError(f"worker {self.row} died:\n{self.tail()}")
        return json.loads(out)


def run_job(job, rows, rounds, seconds, warmup, lib, sampler, snapshot_dir):
    workers = [Worker(job, r, lib) for r in rows]
    res = {w.row: [] for w in workers}
    n = 0
    for rnd in range(rounds + 1):
        k = 0 if rnd == 0 else rnd % len(workers)
        for w in workers[k:] + workers[:k]:
            r = sampler.watch(w.pid, lambda w=w: w.ask(f"round {warmup}" if rnd == 0 else f"steps {n}"))
            if rnd == 0 and w.row == "torch":
                n = max(2, round(r["steps"] / r["wall"] * seconds))
            if rnd > 0:
                res[w.row].append(r)
        if rnd > 0:
            def said(r):
                extra = f"/{r['driver_allocs']}da" if "driver_allocs" in r else ""
                return f"{r['steps'] / r['wall']:.2f}({1e3 * r['slowest_step']:.0f}ms max{extra})"
            print(f"  {job} round {rnd}: " + " ".join(f"{w.row}={said(res[w.row][-1])}" for w in workers), flush=True)
    peaks = {}
    for w in workers:
        snap = os.path.join(snapshot_dir, f"{job}-{w.row}.pickle") if snapshot_dir else ""
        now = sampler.nvml.used().get(w.pid, 0)
        peaks[w.row] = w.ask(f"peak {snap}".strip())
        peaks[w.row]["nvml_end"] = now
        w.p.wait(timeout=120)
    base = [r["steps"] / r["wall"] for r in res["torch"]]
    table = []
    for w in workers:
        sps = [r["steps"] / r["wall"] for r in res[w.row]]
        table.append({
            "job": job, "row": w.row, "steps_per_s": statistics.median(sps),
            "ratio_q": quartiles([a / b for a, b in zip(sps, base)]),
            "cpu_ms_per_step": 1e3 * statistics.median(r["cpu"] / r["steps"] for r in res[w.row]),
            "wall_ms_per_step": 1e3 / statistics.median(sps),
            "nvml_sampled_peak_mib": sampler.peak.get(w.pid, 0) / 2**20,
            **{k: v / 2**20 if isinstance(v, int) else v for k, v in peaks[w.row].items()},
            "driver_allocs_after_warmup": sum(r.get("driver_allocs", 0) for r in res[w.row]),
        })
        t = table[-1]
        reserved_end = t.get("cp_reserved", t["torch_reserved"])
        t["outside_mib"] = t["nvml_end"] - reserved_end
        t["peak_mib"] = t.get("cp_max_reserved", t["torch_max_reserved"]) + t["outside_mib"]
    return table


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of steps before the first round counted")
    ap.add_argument("--lib", default=os.path.join(ROOT, "target", "release", "libcudapool.so"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--snapshots", default=None, help="a folder: each cudapool row writes its snapshot there at the end")
    ap.add_argument("--no-sampler", action="store_true", help="no NVML readings (to see what they cost)")
    a = ap.parse_args()
    rows = a.rows.split(",")
    assert rows[0] == "torch", "the first row is the reference: torch"
    sampler = Sampler(Nvml(), enabled=not a.no_sampler)
    t0 = time.time()
    out = []
    for job in a.jobs.split(","):
        print(f"== {job}: {a.rounds} rounds of {a.seconds} s, rows {', '.join(rows)}", flush=True)
        try:
            rows_out = run_job(job, rows, a.rounds, a.seconds, a.warmup, os.path.abspath(a.lib), sampler, a.snapshots)
        except RuntimeError as e:
            print(f"  {job} failed: {e}", flush=True)
            continue
        out += rows_out
        table(rows_out)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(out, f, indent=1)
    print(f"\n{sampler.reads / max(time.time() - t0, 1e-9):.0f} NVML readings a second\n")
    table(out)


def table(out):
    print("| job | row | speed vs torch, median [IQR] | ms/step | host CPU ms/step | peak MiB | vs torch-exp | allocator peak reserved MiB | outside the allocator MiB | NVML sampled peak MiB | driver allocs after warm-up |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    exp = {t["job"]: t["peak_mib"] for t in out if t["row"] == "torch-exp"}
    for t in out:
        lo, med, hi = t["ratio_q"]
        alloc = t.get("cp_max_reserved", t["torch_max_reserved"])
        vs = f"{t['peak_mib'] / exp[t['job']]:.3f}" if exp.get(t["job"]) else ""
        print(f"| {t['job']} | {t['row']} | {med:.3f} [{lo:.3f}-{hi:.3f}] | {t['wall_ms_per_step']:.1f} | "
              f"{t['cpu_ms_per_step']:.1f} | {t['peak_mib']:.0f} | {vs} | {alloc:.0f} | {t['outside_mib']:.0f} | "
              f"{t['nvml_sampled_peak_mib']:.0f} | {t['driver_allocs_after_warmup']} |", flush=True)


if __name__ == "__main__":
    main()
