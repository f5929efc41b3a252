"""Attention on the live backend: the blockwise form the layers use (``attention.blockwise_attention``)
beside transformers' eager form (``attention.eager_attention``, full [B, K, G, S, S] fp32 scores),
forward and forward + backward (``jax.vjp``), and XLA's compiled temporary bytes of each; first the
core alone, then one whole decoder layer (hidden 1024, SwiGLU 2816) with either form inside it.
Medians of interleaved repeats, in one process.

The core alone takes q, k, v as the program's inputs, in row-major [B, S, H, E]; inside a layer
they are intermediates whose layout XLA chooses, so a layout the core alone pays for can be free
there. The layer rows are what a training step sees.

Run: python benchmarks/attention_speed.py [--repeats 7] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import lazytrain_jax as lt
from lazytrain_jax.executor.profiler import median_seconds_interleaved
from lazytrain_jax.model import layers, units
from lazytrain_jax.model.attention import BLOCK_KEYS, blockwise_attention, eager_attention

# (batch, sequence, query heads, kv heads, head dim): the CPU benchmark's layer, a 0.5B-like and a
# 3B-like layer at 1-2k tokens
SHAPES = ((2, 256, 16, 4, 64), (1, 1024, 14, 2, 64), (1, 2048, 16, 2, 128))


def _fns(fn, q, k, v, mask, g):
    def fwd(q, k, v):
        return fn(q, k, v, mask)

    def fwd_bwd(q, k, v, g):
        out, vjp = jax.vjp(fwd, q, k, v)
        return (out,) + vjp(g)
    return jax.jit(fwd), jax.jit(fwd_bwd)


def _temp_mb(jitted, *args) -> float:
    analysis = jitted.lower(*args).compile().memory_analysis()
    return float("nan") if analysis is None else analysis.temp_size_in_bytes / 1e6


def _layer_fns(cfg, attention, B, S):
    """A decoder layer's forward and forward + backward, traced with ``attention`` as its core."""
    saved = layers.blockwise_attention
    layers.blockwise_attention = lambda q, k, v, mask, block: attention(q, k, v, mask)
    try:
        layer = units._layer_fn(cfg, "decoder")
        pos = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
        mask = jnp.ones((B, S), jnp.int32)

        def fwd(p, h):
            return layer(p, h, pos, mask)

        def fwd_bwd(p, h, g):
            out, vjp = jax.vjp(fwd, p, h)
            return (out,) + vjp(g)
        fwd, fwd_bwd = jax.jit(fwd), jax.jit(fwd_bwd)
        params = units._abstract(cfg, "decoder")[1]
        params = jax.tree.map(lambda a: 0.02 * jax.random.normal(jax.random.PRNGKey(1), a.shape, a.dtype), params)
        h = jax.random.normal(jax.random.PRNGKey(2), (B, S, cfg.hidden_size))
        g = jax.random.normal(jax.random.PRNGKey(3), (B, S, cfg.hidden_size))
        fwd(params, h), fwd_bwd(params, h, g)  # traced here, with ``attention`` in place
    finally:
        layers.blockwise_attention = saved
    return (lambda: fwd(params, h)), (lambda: fwd_bwd(params, h, g))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    dtype = jnp.dtype(args.dtype)
    print(f"attention core, {jax.devices()[0].platform}, {args.dtype}, key block {BLOCK_KEYS}, "
          f"median of {args.repeats} interleaved repeats (ms; temp = XLA's compiled temporary bytes)")
    print(f"  {'B, S, H, K, E':22s} {'blockwise fwd':>13s} {'eager fwd':>9s} {'blockwise f+b':>13s} "
          f"{'eager f+b':>9s} {'eager/blockwise f+b':>19s} {'temp f+b MB':>16s}  max |grad diff|")
    for B, S, H, K, E in SHAPES:
        keys = jax.random.split(jax.random.PRNGKey(0), 4)
        q = jax.random.normal(keys[0], (B, S, H, E), dtype)
        k = jax.random.normal(keys[1], (B, S, K, E), dtype)
        v = jax.random.normal(keys[2], (B, S, K, E), dtype)
        g = jax.random.normal(keys[3], (B, S, H, E), dtype)
        mask = jnp.ones((B, S), jnp.int32).at[:, :3].set(0)  # some left padding
        bf, bfb = _fns(blockwise_attention, q, k, v, mask, g)
        ef, efb = _fns(eager_attention, q, k, v, mask, g)
        t = median_seconds_interleaved({"bf": lambda: bf(q, k, v), "ef": lambda: ef(q, k, v),
                                        "bfb": lambda: bfb(q, k, v, g), "efb": lambda: efb(q, k, v, g)},
                                       repeats=args.repeats, warmup=2)
        diff = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
                   for a, b in zip(bfb(q, k, v, g)[1:], efb(q, k, v, g)[1:]))
        temps = f"{_temp_mb(bfb, q, k, v, g):7.1f} / {_temp_mb(efb, q, k, v, g):7.1f}"
        print(f"  {str((B, S, H, K, E)):22s} {1e3 * t['bf']:13.2f} {1e3 * t['ef']:9.2f} {1e3 * t['bfb']:13.2f} "
              f"{1e3 * t['efb']:9.2f} {t['efb'] / t['bfb']:19.2f} {temps:>16s}  {diff:.2e}", flush=True)
    cfg = lt.get_preset("llama-debug").replace(hidden_size=1024, intermediate_size=2816, num_layers=1,
                                               layer_kinds=("decoder",), num_heads=16, num_kv_heads=4, head_dim=64)
    print(f"one decoder layer (hidden 1024, 16 heads, 4 kv heads, head dim 64), fp32, ms:")
    print(f"  {'B, S':12s} {'blockwise fwd':>13s} {'eager fwd':>9s} {'blockwise f+b':>13s} {'eager f+b':>9s} "
          f"{'eager/blockwise f+b':>19s}")
    for B, S in ((2, 256), (1, 1024), (1, 2048)):
        bf, bfb = _layer_fns(cfg, lambda q, k, v, m: blockwise_attention(q, k, v, m, BLOCK_KEYS), B, S)
        ef, efb = _layer_fns(cfg, eager_attention, B, S)
        t = median_seconds_interleaved({"bf": bf, "ef": ef, "bfb": bfb, "efb": efb}, repeats=args.repeats, warmup=1)
        print(f"  {str((B, S)):12s} {1e3 * t['bf']:13.2f} {1e3 * t['ef']:9.2f} {1e3 * t['bfb']:13.2f} "
              f"{1e3 * t['efb']:9.2f} {t['efb'] / t['bfb']:19.2f}", flush=True)


if __name__ == "__main__":
    main()
