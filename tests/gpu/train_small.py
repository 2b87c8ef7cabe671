"""A small transformer trained for a few steps on random data (fixed seed): a realistic mix of
allocation sizes for trace recording and end-to-end checks."""
import torch

torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=4), torch.nn.Linear(512, 1000)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(8):
    x = torch.randn(32, 128, 512, device="cuda")
    y = torch.randint(0, 1000, (32, 128), device="cuda")
    loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 1000), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
