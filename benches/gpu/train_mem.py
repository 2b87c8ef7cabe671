"""Training throughput and memory, for `scripts/bench-gpu.sh e2e` (issue 11).

usage: train_mem.py gpt|cnn|gen [--sync] [--steps N] [--warmup W] [--batch B] [--limit BYTES]
       torchrun --nproc_per_node=2 train_mem.py gpt --ddp

gpt   a 6-layer GPT-style decoder (d_model 768, 12 heads, causal, vocab 16384), batch 16 x 512
      tokens, AdamW
cnn   torchvision ResNet-50, batch 64 at 224x224, bf16 autocast, channels_last, SGD momentum
gen   GPT-2 (12 layers, transformers, random weights) generating: each step a batch of 1 to 8
      prompts of 16 to 128 tokens (the same sequence every run) gets 32 new tokens, greedy
--batch  the batch of gpt or cnn (the largest batch that fits: benches/gpu/largest_batch.sh)
--limit  PyTorch's own allocator only: set_per_process_memory_fraction(BYTES / total), as a
         user caps PyTorch (under cudapool, CUDAPOOL_MEMORY_LIMIT does it)
--sync   reads the loss every step (loss.item(), a device synchronisation)
--ddp    DistributedDataParallel over NCCL, one process per GPU (start it with torchrun)
--side   gpt or cnn: DDP's two queues on one GPU. Each parameter's gradient, once accumulated
         (in the autograd thread, as DDP's hooks run), is "reduced" on a second stream, a
         stand-in for NCCL's all-reduce: the side stream waits for the compute stream, scales
         the gradient into a new buffer and copies it back (record_stream tells PyTorch's
         caching allocator); the compute stream waits for the side stream before the
         optimizer step

Prints one line per process:
  workload=... steps_per_s=... peak_reserved=BYTES peak_allocated=BYTES peak_requested=BYTES
  source=torch|cudapool
  outside=BYTES nvml_used=BYTES allocs=N driver_allocs=N loss=...
peak_reserved is the allocator's own figure: cudapool's when the process runs under cudapool,
else torch.cuda.max_memory_reserved() (PyTorch's caching allocator, or the driver pool of the
cudaMallocAsync backend). Under cudapool it covers everything the process allocates, NCCL's
own buffers (VMM memory) included, which PyTorch's figure leaves out: `outside` is what cudapool
counts outside its pool at the end (its reserved bytes less its pool's segments), so
peak_reserved - outside is the pool's peak, the figure comparable to PyTorch's (NCCL's buffers
live from its start to the end). nvml_used is the process's whole device memory as the driver
reports it at the end (allocators keep what they reserved, so it is about the peak): context,
libraries and NCCL included, either way. allocs and driver_allocs count cudapool's
allocations and driver allocations after the warm-up.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cbindings", "python"))
import cudapool  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("workload", choices=["gpt", "cnn", "gen"])
p.add_argument("--batch", type=int, default=0)
p.add_argument("--limit", type=int, default=0)
p.add_argument("--sync", action="store_true")
p.add_argument("--ddp", action="store_true")
p.add_argument("--side", action="store_true")
p.add_argument("--steps", type=int, default=40)
p.add_argument("--warmup", type=int, default=5)
args = p.parse_args()

rank = 0
if args.ddp:
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
dev = torch.cuda.current_device()
torch.manual_seed(0)
if args.limit:
    torch.cuda.set_per_process_memory_fraction(args.limit / torch.cuda.get_device_properties(dev).total_memory, dev)


class GPT(torch.nn.Module):
    def __init__(self, vocab=16384, d=768, heads=12, layers=6, ctx=512):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(ctx, d)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                                 batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(ctx), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        x = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(x))


if args.workload == "gpt":
    model = net = GPT().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b = args.batch or 16

    def batch():
        idx = torch.randint(0, 16384, (b, 513), device="cuda")
        return idx[:, :-1], idx[:, 1:]

    def loss_of(x, y):
        return torch.nn.functional.cross_entropy(net(x).reshape(-1, 16384), y.reshape(-1))
elif args.workload == "cnn":
    import torchvision

    model = net = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    b = args.batch or 64

    def batch():
        x = torch.randn(b, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
        return x, torch.randint(0, 1000, (b,), device="cuda")

    def loss_of(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return torch.nn.functional.cross_entropy(net(x), y)
else:
    import random

    import transformers

    transformers.logging.set_verbosity_error()
    model = net = transformers.GPT2LMHeadModel(transformers.GPT2Config()).cuda().eval()
    shapes = random.Random(0)
    opt = None

if args.ddp:
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev])
side = None
if args.side and args.workload != "gen":
    side = torch.cuda.Stream()

    def reduce_on_side(prm):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            buf = prm.grad * 0.5
            prm.grad.copy_(buf.mul_(2.0))
        prm.grad.record_stream(side)
        buf.record_stream(side)

    for prm in model.parameters():
        prm.register_post_accumulate_grad_hook(reduce_on_side)


def step():
    if args.workload == "gen":
        n, t = shapes.choice([1, 2, 4, 8]), shapes.randint(16, 128)
        prompt = torch.randint(0, 50257, (n, t), device="cuda")
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32,
                                 min_new_tokens=32, do_sample=False, pad_token_id=0)
        return out.float().mean()
    x, y = batch()
    loss = loss_of(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if side is not None:
        torch.cuda.current_stream().wait_stream(side)
    opt.step()
    if args.sync:
        loss.item()
    return loss


def main():
    pooled = cudapool.is_loaded()


    def counts():
        if not pooled:
            return (0, 0)
        s = cudapool.memory_stats(dev)
        return (s["alloc_calls"], s["driver_allocs"])


    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    before = counts()
    t = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    after = counts()

    outside = 0
    if pooled:
        peak_reserved, peak_allocated, source = cudapool.max_memory_reserved(dev), cudapool.max_memory_allocated(dev), "cudapool"
        peak_requested = cudapool.memory_stats(dev)["peak_requested_bytes"]
        import json
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cudapool.snapshot(f.name)
            snap = json.load(open(f.name))
        for d in snap["devices"]:
            if d["device"] == dev:
                outside = d["stats"]["reserved_bytes"] - sum(s["size"] for s in d["segments"])
    else:
        peak_reserved, peak_allocated, source = torch.cuda.max_memory_reserved(dev), torch.cuda.max_memory_allocated(dev), "torch"
        peak_requested = torch.cuda.memory_stats(dev).get("requested_bytes.all.peak", -1)

    nvml_used = -1
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(dev)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if proc.pid == os.getpid():
                nvml_used = proc.usedGpuMemory
    except Exception as e:  # noqa: BLE001 - a figure we can do without
        print(f"nvml: {e}", file=sys.stderr)

    name = args.workload + (" sync" if args.sync else "") + (" ddp" if args.ddp else "") + (" side" if side is not None else "")
    print(
        f"workload={name.replace(' ', '+')} rank={rank} steps_per_s={args.steps / dt:.3f} peak_reserved={peak_reserved} "
        f"peak_allocated={peak_allocated} peak_requested={peak_requested} source={source} outside={outside} nvml_used={nvml_used} allocs={after[0] - before[0]} "
        f"driver_allocs={after[1] - before[1]} loss={loss.item():.4f}",
        flush=True,
    )
    if args.ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
