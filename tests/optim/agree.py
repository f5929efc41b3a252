"""What "the native kernel agrees with XLA to fp32 rounding" means, checked one way everywhere."""

import jax
import jax.numpy as jnp
import numpy as np


def assert_params_agree(a, b, max_abs: float):
    """Params of two implementations: every element within ``max_abs`` (a fraction of one step's
    size: a code one step apart moves an element by less than its update), and all but 0.1 % equal
    to 1e-6 of the tensor's largest value (fp32 rounding)."""
    la, lb = jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_flatten_with_path(b)[0]
    for (path, x), (_, y) in zip(la, lb, strict=True):
        diff = np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32))
        name = jax.tree_util.keystr(path)
        assert diff.max() <= max_abs, (name, diff.max())
        assert np.mean(diff > 1e-6 * np.abs(np.asarray(y, np.float32)).max()) < 1e-3, name


def assert_state_agrees(a, b):
    """Adam states (``mu``, ``nu``, scales): fp32 moments within fp32 rounding (a few ulp, and
    1e-6 of the tensor's largest value where a moment passes near zero), 8-bit codes at most 2
    steps apart on under 0.1 % of elements, scales within fp32 rounding."""
    for name in ("mu", "nu"):
        for x, y in zip(jax.tree.leaves(getattr(a, name)), jax.tree.leaves(getattr(b, name)),
                        strict=True):
            if x.dtype == jnp.float32:
                y32 = np.asarray(y)
                np.testing.assert_allclose(np.asarray(x), y32, rtol=1e-5, atol=1e-6 * np.abs(y32).max())
                continue
            d = np.abs(np.asarray(x, np.int32) - np.asarray(y, np.int32))
            assert d.max() <= 2 and np.mean(d > 0) < 1e-3, name
    for name in ("mu_scales", "nu_scales"):
        for x, y in zip(jax.tree.leaves(getattr(a, name)), jax.tree.leaves(getattr(b, name)),
                        strict=True):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=0)
