"""PyTorch's own CUDA IPC (torch.multiprocessing): a child process receives tensors and sums
them. Run with and without cudapool; with it, the tensors are pooled blocks (caching off) or
pieces of PyTorch's segments that are themselves blocks (caching on), most of them inside a
shared cudapool segment. Prints one line: 'torch ipc ok N tensors' or what differed.
"""

import torch
import torch.multiprocessing as mp


def child(q, r):
    ts = q.get()
    r.put([float(t.double().sum()) for t in ts])
    del ts


def main():
    mp.set_start_method("spawn")
    ts = []
    # The last, 256 MiB, is a segment of its own in PyTorch's cache: 128 chunks of cudapool's
    # expandable range, each its own descriptor in the export.
    for i, n in enumerate([1000, 3 << 18, 5 << 20, 1000, 777, 300 << 10, 64 << 20]):
        ts.append(torch.arange(n, device="cuda", dtype=torch.float32) * (i + 1))
    ts.append(ts[2][100:200])  # a view at an offset into its storage
    q, r = mp.Queue(), mp.Queue()
    p = mp.Process(target=child, args=(q, r))
    p.start()
    q.put(ts)
    got = r.get(timeout=120)
    p.join(timeout=60)
    want = [float(t.double().sum()) for t in ts]
    if got == want:
        print(f"torch ipc ok {len(ts)} tensors")
    else:
        print(f"torch ipc MISMATCH got={got} want={want}")


if __name__ == "__main__":
    main()
