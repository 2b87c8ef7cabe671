"""DDP on two GPUs (issue 45): HF transformers' GPT-2 (6 layers, width 768, fp32, batch 8 x 512
per rank) trained with DistributedDataParallel over NCCL, one torchrun launch per row and
round, rows interleaved over rounds; per rank: steps/s, peak memory (the allocator's peak plus
what the process holds outside it, as nvidia-smi counts it), and under cudapool NCCL's own
buffers (the memory cudapool counts outside its pool: NCCL maps it with cuMemCreate) named
apart. The cp row runs its ranks as one cudapool group (CUDAPOOL_GROUP) and prints what the
group says: only processes that use the GPU are its members there (torchrun's agent is not).

usage: python3 benches/gpu/ddp.py [--rows torch,torch-exp,cp,cp-pooled] [--rounds 2]
           [--steps 60] [--lib target/release/libcudapool.so] [--history N]

With --history N the cudapool rows keep their last N allocator events (CUDAPOOL_HISTORY) and
each rank's snapshot (/tmp/ddp-snap-PID.pickle, PyTorch's format) holds them: `cudapool replay
--pool split SNAPSHOT` then replays that rank's requests with every free reusable at once, and
the difference to the live run's reserved peak is what waiting for fences cost (400000 events
hold 75 steps of this job).
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
ROWS = {
    "torch": {},
    "torch-exp": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cp": {"LD_PRELOAD": "LIB", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDAPOOL_GROUP": "ddp",
           "CUDAPOOL_GROUP_LIMIT": "60GiB"},
    "cp-pooled": {"LD_PRELOAD": "LIB", "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
}


def nvml_used(uuid):
    """This process's device memory on the GPU of `uuid`, as NVML (nvidia-smi) counts it."""
    class P(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]
    nv = ctypes.CDLL("libnvidia-ml.so.1")
    nv.nvmlInit_v2()
    n = ctypes.c_uint()
    nv.nvmlDeviceGetCount_v2(ctypes.byref(n))
    for i in range(n.value):
        h = ctypes.c_void_p()
        nv.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
        buf = ctypes.create_string_buffer(96)
        nv.nvmlDeviceGetUUID(h, buf, 96)
        if buf.value.decode().replace("GPU-", "") != uuid:
            continue
        cnt = ctypes.c_uint(64)
        procs = (P * 64)()
        nv.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(cnt), procs)
        return {procs[k].pid: procs[k].used for k in range(cnt.value)}.get(os.getpid(), 0)
    return 0


def worker(steps, warmup):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import GPT2Config, GPT2LMHeadModel

    sys.path.insert(0, os.path.join(ROOT, "cbindings", "python"))
    import cudapool

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    dev = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(dev)
    torch.manual_seed(0)
    model = DDP(GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=512)).cuda(), device_ids=[dev])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        x = torch.randint(0, 50257, (8, 512), device="cuda")
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    wall = time.perf_counter() - t0
    out = {"rank": rank, "steps_per_s": steps / wall,
           "torch_max_reserved": torch.cuda.max_memory_reserved(), "torch_reserved": torch.cuda.memory_reserved()}
    if cudapool.is_loaded():
        s = cudapool.memory_stats(dev)
        out.update(cp_max_reserved=s["peak_reserved_bytes"], cp_reserved=s["reserved_bytes"])
        path = f"/tmp/ddp-snap-{os.getpid()}.pickle"
        cudapool.snapshot(path, format="torch")
        import pickle

        segs = pickle.load(open(path, "rb"))["segments"]
        out["outside_pool"] = sum(g["total_size"] for g in segs if g.get("origin") != "pool")
        out["snapshot"] = path
        try:
            out["group"] = cudapool.group_stats(dev)
        except cudapool.NotInGroup:
            pass
    out["nvml_end"] = nvml_used(str(torch.cuda.get_device_properties(dev).uuid))
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="torch,torch-exp,cp,cp-pooled")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--lib", default=os.path.join(ROOT, "target", "release", "libcudapool.so"))
    ap.add_argument("--history", type=int, default=0, help="CUDAPOOL_HISTORY for the cudapool rows")
    a = ap.parse_args()
    rows = a.rows.split(",")
    res = {r: [] for r in rows}
    stat_lines = []
    for rnd in range(a.rounds):
        order = rows[rnd % len(rows):] + rows[:rnd % len(rows)]
        for row in order:
            env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("CUDAPOOL_")}
            for k, v in ROWS[row].items():
                env[k] = os.path.abspath(a.lib) if v == "LIB" else v
            if a.history > 0 and "LD_PRELOAD" in env:
                env["CUDAPOOL_HISTORY"] = str(a.history)
            p = subprocess.Popen(["torchrun", "--standalone", "--nproc_per_node=2", os.path.abspath(__file__),
                                  "--worker", str(a.steps), str(a.warmup)],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if row == "cp":
                # What a reader of the group sees while the job runs (the agent is a member
                # that uses no GPU).
                time.sleep(18)
                cli = os.path.join(ROOT, "target", "release", "cudapool")
                if os.path.exists(cli):
                    st = subprocess.run([cli, "stat"], capture_output=True, text=True,
                                        env={k: v for k, v in env.items() if k != "LD_PRELOAD"})
                    stat_lines += [l for l in st.stdout.splitlines() if l.startswith(("group", "  GPU-"))]
            out, err = p.communicate(timeout=400)
            got = [json.loads(l[7:]) for l in out.splitlines() if l.startswith("RESULT ")]
            if len(got) != 2:
                print(f"{row} round {rnd}: failed\n{err[-2000:]}", flush=True)
                continue
            res[row].append(got)
            print(f"{row} round {rnd}: " + " ".join(f"rank{g['rank']} {g['steps_per_s']:.2f}/s" for g in got), flush=True)
    print()
    base = [statistics.mean(g["steps_per_s"] for g in r) for r in res.get("torch", [])]
    print("| row | steps/s (mean of ranks), per round | vs torch, per round | peak MiB per rank | NCCL's buffers MiB per rank | group members seen by each rank |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        sps = [statistics.mean(g["steps_per_s"] for g in r) for r in res[row]]
        ratio = [f"{x / b:.4f}" for x, b in zip(sps, base)]
        last = res[row][-1] if res[row] else []
        peaks = []
        for g in sorted(last, key=lambda g: g["rank"]):
            held = g.get("cp_reserved", g["torch_reserved"])
            peak = g.get("cp_max_reserved", g["torch_max_reserved"]) + g["nvml_end"] - held
            peaks.append(f"{peak / 2**20:.0f}")
        nccl = [f"{g['outside_pool'] / 2**20:.0f}" for g in sorted(last, key=lambda g: g["rank"]) if "outside_pool" in g]
        members = [str(g["group"]["members"]) for g in sorted(last, key=lambda g: g["rank"]) if "group" in g]
        print(f"| {row} | {', '.join(f'{x:.3f}' for x in sps)} | {', '.join(ratio)} | {' / '.join(peaks)} | "
              f"{' / '.join(nccl)} | {' / '.join(members)} |")
    snaps = [(row, g["rank"], g["snapshot"]) for row in rows for r in res[row][-1:] for g in r if "snapshot" in g]
    if a.history > 0 and snaps:
        print("\nsnapshots with history (replay each: cudapool replay --pool split FILE):")
        print("\n".join(f"  {row} rank {rank}: {path}" for row, rank, path in snaps))
    if stat_lines:
        print("\ncudapool stat, while the cp row ran:")
        print("\n".join(stat_lines))


if __name__ == "__main__":
    main()
