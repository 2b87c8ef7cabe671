"""Training under cudapool with CUDAPOOL_TRACE: a few steps, a pause (for `cudapool stat`), an
oversized tensor refused at the limit, empty_cache, more steps."""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cbindings", "python"))
import cudapool  # noqa: E402

torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True)
model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=6), torch.nn.Linear(1024, 1000)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)


def steps(n):
    for _ in range(n):
        x = torch.randn(32, 256, 1024, device="cuda")
        y = torch.randint(0, 1000, (32, 256), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 1000), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return loss.item()


print("loss", steps(6), flush=True)
print("pausing for cudapool stat", flush=True)
time.sleep(3)
try:
    torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
except Exception as e:  # noqa: BLE001
    print("8 GiB refused:", type(e).__name__, flush=True)
print("empty_cache released", cudapool.empty_cache() >> 20, "MiB", flush=True)
print("loss", steps(4), flush=True)
