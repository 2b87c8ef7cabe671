"""One framework on the GPU, for scripts/gpu-check.sh.

usage: fw.py torch|cupy|jax|numba work|fill|idle
  work  a small real workload with a fixed seed; prints results that must not change under
        cudapool (compare the output with and without it)
  fill  takes 128 MiB arrays until the framework refuses; prints granted_mib and the class of
        the framework's error, holds the memory 1.5 s (nvidia-smi watches from outside)
  idle  the workload's warm-up, then everything freed, held 1.5 s: the context's own overhead
Run torch with PYTORCH_NO_CUDA_MEMORY_CACHING=1 or a PYTORCH_CUDA_ALLOC_CONF, cupy with its pool
off (done here), jax with XLA_PYTHON_CLIENT_ALLOCATOR=platform.
"""
import gc
import sys
import time

which, mode = sys.argv[1], sys.argv[2]
CHUNK = 128 << 20


def fill(make):
    held, error = [], "none"
    try:
        for _ in range(512):
            held.append(make())
    except Exception as e:  # noqa: BLE001 - the class is the point
        error = f"{type(e).__module__}.{type(e).__name__}"
        first = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
        error += f" ({first})"
    print(f"framework={which} granted_mib={len(held) * (CHUNK >> 20)} error={error}", flush=True)
    time.sleep(1.5)
    return held


if which == "torch":
    import torch

    def work():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, padding=1),
            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(5):
            x = torch.randn(64, 3, 64, 64, device="cuda")
            y = torch.randint(0, 10, (64,), device="cuda")
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"torch step {step} loss {loss.item():.6f}")

    if mode == "fill":
        fill(lambda: torch.ones(CHUNK // 4, device="cuda"))
    else:
        work()
        if mode == "idle":
            gc.collect()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            time.sleep(1.5)
elif which == "cupy":
    import cupy

    cupy.cuda.set_allocator(None)  # CuPy's own pool off: every array is a driver allocation

    def work():
        rs = cupy.random.RandomState(0)
        a = rs.standard_normal((512, 512), dtype=cupy.float64)
        b = rs.standard_normal((512,), dtype=cupy.float64)
        x = cupy.linalg.solve(a + 512 * cupy.eye(512), b)
        f = cupy.fft.fft(cupy.arange(4096, dtype=cupy.float64)).real.sum()
        print(f"cupy solve {float(x.sum()):.10f} fft {float(f):.6f} sort {float(cupy.sort(b)[7]):.10f}")

    if mode == "fill":
        fill(lambda: cupy.ones(CHUNK // 4, dtype=cupy.float32))
    else:
        work()
        if mode == "idle":
            gc.collect()
            cupy.cuda.Device().synchronize()
            time.sleep(1.5)
elif which == "jax":
    import jax
    import jax.numpy as jnp

    def work():
        key = jax.random.PRNGKey(0)
        k1, k2 = jax.random.split(key)
        w = jax.random.normal(k1, (256, 10)) * 0.01
        x = jax.random.normal(k2, (1024, 256))
        y = jnp.arange(1024) % 10

        def loss(w):
            logits = x @ w
            return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(1024), y])

        step = jax.jit(lambda w: w - 0.5 * jax.grad(loss)(w))
        for i in range(5):
            w = step(w)
            print(f"jax step {i} loss {float(loss(w)):.6f}")

    if mode == "fill":
        fill(lambda: jnp.ones((CHUNK // 4,), dtype=jnp.float32).block_until_ready())
    else:
        work()
        if mode == "idle":
            gc.collect()
            time.sleep(1.5)
elif which == "numba":
    import numpy as np

    if not hasattr(np, "row_stack"):
        # numba-cuda 0.x still names np.row_stack, which NumPy 2.4 removed: the kernel compiler
        # fails on import without this alias (with or without cudapool).
        np.row_stack = np.vstack
    from numba import cuda

    def work():
        @cuda.jit
        def saxpy(a, x, y, out):
            i = cuda.grid(1)
            if i < out.size:
                out[i] = a * x[i] + y[i]

        x = cuda.to_device(np.arange(1 << 20, dtype=np.float32))
        y = cuda.to_device(np.ones(1 << 20, dtype=np.float32))
        out = cuda.device_array(1 << 20, dtype=np.float32)
        saxpy[(1 << 20) // 256, 256](2.0, x, y, out)
        h = out.copy_to_host()
        print(f"numba saxpy sum {float(h.sum(dtype=np.float64)):.1f} last {float(h[-1]):.1f}")
        del x, y, out
        gc.collect()
        cuda.current_context().deallocations.clear()

    if mode == "fill":
        fill(lambda: cuda.device_array(CHUNK // 4, dtype=np.float32))
    else:
        work()
        if mode == "idle":
            time.sleep(1.5)
else:
    sys.exit(f"unknown framework {which}")
