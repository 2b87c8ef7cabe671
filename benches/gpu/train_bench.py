"""End-to-end training throughput (issue 5): the transformer of train_small.py, larger batch,
5 warm-up steps then 30 timed ones. Prints steps_per_s=X. Run it with PyTorch's own allocator,
with PYTORCH_NO_CUDA_MEMORY_CACHING=1, and with that under cudapool."""
import time

import torch

torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=6), torch.nn.Linear(512, 1000)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)


def step():
    x = torch.randn(32, 256, 512, device="cuda")
    y = torch.randint(0, 1000, (32, 256), device="cuda")
    loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 1000), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


for _ in range(5):
    step()
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(30):
    loss = step()
torch.cuda.synchronize()
dt = time.perf_counter() - t
print(f"steps_per_s={30 / dt:.3f} loss={loss.item():.4f}")
