"""``lt.optim.adamw_8bit`` in a plain Flax NNX + optax training loop: no streaming, no planner.

A small MLP learns y = sin(3x) with the hybrid 8-bit AdamW (8-bit Adam state for the large weight
matrices, fp32 for biases and small tensors, clipping fused); the same loop with optax's fp32 AdamW
runs alongside for comparison.

    python examples/optax_standalone.py --steps 500
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import lazytrain_jax as lt


class MLP(nnx.Module):
    def __init__(self, width: int, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(1, width, rngs=rngs)
        self.l2 = nnx.Linear(width, width, rngs=rngs)
        self.l3 = nnx.Linear(width, 1, rngs=rngs)

    def __call__(self, x):
        return self.l3(jax.nn.gelu(self.l2(jax.nn.gelu(self.l1(x)))))


def fit(tx: optax.GradientTransformation, steps: int, width: int, seed: int = 0) -> list[float]:
    graphdef, params = nnx.split(MLP(width, nnx.Rngs(seed)), nnx.Param)
    state = tx.init(params)
    xs = jnp.linspace(-1.0, 1.0, 256)[:, None]
    ys = jnp.sin(3.0 * xs)

    @jax.jit
    def step(params, state):
        def loss_fn(p):
            return jnp.mean((nnx.merge(graphdef, p)(xs) - ys) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for _ in range(steps):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    return losses


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--width", type=int, default=256, help="hidden width (256: the 256x256 matrix gets 8-bit state)")
    args = p.parse_args(argv)
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, max(1, args.steps // 20), args.steps)
    runs = {"adamw_8bit": lt.optim.adamw_8bit(learning_rate=schedule, weight_decay=0.01, max_grad_norm=1.0),
            "optax fp32 adamw": optax.chain(optax.clip_by_global_norm(1.0),
                                            optax.adamw(learning_rate=schedule, weight_decay=0.01))}
    print(f"{'optimizer':<18} {'first loss':>11} {'final loss':>11}")
    for name, tx in runs.items():
        losses = fit(tx, args.steps, args.width)
        print(f"{name:<18} {losses[0]:>11.5f} {losses[-1]:>11.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
