"""A Hugging Face training job put to sleep and woken every N steps ends with the same loss, bit
for bit, as the same job uninterrupted (same seed, deterministic algorithms); and CuPy and JAX
arrays survive a sleep. Run under cudapool:

    python3 sleep_train.py train STEPS EVERY    -> "train steps= every= loss=<hex> sleeps= asleep_mib="
    python3 sleep_train.py cupy                 -> "cupy same=1 asleep_mib="
    python3 sleep_train.py jax                  -> "jax same=1 asleep_mib="

The caller runs `train` twice (EVERY 0 and EVERY 10) and compares the two losses.
"""
import os
import sys

import cudapool


def train(steps, every):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    cfg = GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=256)
    model = GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator(device="cpu").manual_seed(1)
    sleeps, asleep = 0, 0
    for step in range(steps):
        ids = torch.randint(0, cfg.vocab_size, (8, 256), generator=g).cuda()
        loss = model(ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if every and (step + 1) % every == 0:
            cudapool.sleep()
            asleep = max(asleep, cudapool.memory_stats()["asleep_bytes"])
            sleeps += int(cudapool.is_asleep())
    torch.cuda.synchronize()
    print(f"train steps={steps} every={every} loss={loss.item().hex()} sleeps={sleeps} "
          f"asleep_mib={asleep >> 20}")


def cupy_case():
    import cupy as cp

    a = cp.random.default_rng(0).standard_normal((4096, 4096 * 8), dtype=cp.float32)
    ref = float(a.sum())
    cudapool.sleep()
    asleep = cudapool.memory_stats()["asleep_bytes"]
    got = float(a.sum())  # the launch wakes it
    print(f"cupy same={int(got == ref)} asleep_mib={asleep >> 20} awake={int(not cudapool.is_asleep())}")


def jax_case():
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (4096, 4096 * 8))
    ref = float(jnp.sum(a))
    cudapool.sleep()
    asleep = cudapool.memory_stats()["asleep_bytes"]
    got = float(jnp.sum(a))
    print(f"jax same={int(got == ref)} asleep_mib={asleep >> 20} awake={int(not cudapool.is_asleep())}")


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "train":
        train(int(sys.argv[2]), int(sys.argv[3]))
    elif what == "cupy":
        cupy_case()
    else:
        jax_case()
