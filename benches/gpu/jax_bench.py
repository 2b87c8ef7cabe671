"""End-to-end JAX throughput (issue 5): a jitted MLP training step, 20 warm-up steps then 300
timed ones (each step allocates its outputs). Prints steps_per_s=X. Run it with JAX's default
allocator, with XLA_PYTHON_CLIENT_ALLOCATOR=platform, and with that under cudapool."""
import time

import jax
import jax.numpy as jnp

k = jax.random.split(jax.random.PRNGKey(0), 4)
params = [jax.random.normal(k[0], (1024, 2048)) * 0.02, jax.random.normal(k[1], (2048, 1024)) * 0.02]
x = jax.random.normal(k[2], (512, 1024))
y = jax.random.normal(k[3], (512, 1024))


def loss(p):
    h = jax.nn.gelu(x @ p[0])
    return jnp.mean((h @ p[1] - y) ** 2)


@jax.jit
def step(p):
    g = jax.grad(loss)(p)
    return [a - 1e-3 * b for a, b in zip(p, g)]


for _ in range(20):
    params = step(params)
jax.block_until_ready(params)
t = time.perf_counter()
for _ in range(300):
    params = step(params)
jax.block_until_ready(params)
dt = time.perf_counter() - t
print(f"steps_per_s={300 / dt:.2f} loss={float(loss(params)):.6f}")
