"""A PyTorch training step under cudapool (caching off, CUDAPOOL_HISTORY on), its memory as
PyTorch's snapshot pickle (cudapool.snapshot(format="torch")), read by PyTorch's own
torch.cuda._memory_viz: segsum and trace as text, trace_plot and segment_plot as HTML.

usage: python3 tests/gpu/torch_snapshot.py OUT_DIR     (run under cudapool; prints a summary)
"""
import os
import pickle
import sys

import torch
from torch.cuda import _memory_viz

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cbindings", "python"))
import cudapool  # noqa: E402

out = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(256, 1024, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
path = os.path.join(out, "cudapool_torch_snapshot.pickle")
cudapool.snapshot(path, format="torch")
data = pickle.load(open(path, "rb"))
summary = _memory_viz.segsum(data)
trace = _memory_viz.trace(data)
with open(os.path.join(out, "memory_viz_trace_plot.html"), "w") as f:
    f.write(_memory_viz.trace_plot(data))
with open(os.path.join(out, "memory_viz_segment_plot.html"), "w") as f:
    f.write(_memory_viz.segment_plot(data))
events = sum(len(d) for d in data["device_traces"])
print(f"segments={len(data['segments'])} events={events} loss={loss.item():.6f}")
print(summary.splitlines()[-12] if len(summary.splitlines()) > 12 else summary)
print("\n".join(l for l in summary.splitlines() if l.startswith("total_")))
print("trace lines:", len(trace.splitlines()))
