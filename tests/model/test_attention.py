"""Blockwise attention: equal to transformers' eager attention (values and gradients, fully masked rows
included), O(S) residuals, O(S x block) backward workspace, and parity with transformers beyond one block."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lazytrain_jax as lt
from lazytrain_jax.model.attention import BLOCK_KEYS, blockwise_attention, eager_attention
from lazytrain_jax.model.layers import attend
from tests.model.reference_models import make_torch_model


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def qkv(seed, B, S, H, K, E, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(shape), dtype) for shape in ((B, S, H, E), (B, S, K, E), (B, S, K, E))]


def padded_mask(B, S, num_pad):
    """Row 0 unpadded, row 1 left-padded (its first queries see no key at all), row 2 right-padded."""
    mask = np.ones((B, S), np.int32)
    mask[1, :num_pad] = 0
    mask[2 % B, S - num_pad:] = 0 if B > 2 else 1
    return jnp.asarray(mask)


@jax.jit
def _eager_vjp(q, k, v, mask, g):
    out, vjp = jax.vjp(lambda *a: eager_attention(*a, mask), q, k, v)
    return out, vjp(g)


@pytest.mark.parametrize("S,block,num_heads,num_kv", [pytest.param(13, 4, 8, 2, marks=pytest.mark.slow), (13, 5, 4, 4), (37, 16, 4, 2),
                                                    pytest.param(9, 64, 8, 2, marks=pytest.mark.slow)])
def test_values_and_gradients_equal_eager(S, block, num_heads, num_kv):
    q, k, v = qkv(S + block, 3, S, num_heads, num_kv, 8)
    mask = padded_mask(3, S, num_pad=min(7, S - 1))
    g = qkv(1, 3, S, num_heads, num_kv, 8)[0]  # cotangent everywhere, fully masked rows included

    @jax.jit
    def blockwise_vjp(q, k, v, mask, g):
        out, vjp = jax.vjp(lambda *a: blockwise_attention(*a, mask, block), q, k, v)
        return out, vjp(g)

    (out, grads), (ref, ref_grads) = blockwise_vjp(q, k, v, mask, g), _eager_vjp(q, k, v, mask, g)
    assert rel_err(out, ref) < 1e-5
    for name, a, b in zip("qkv", grads, ref_grads):
        assert rel_err(a, b) < 1e-5, name
        assert rel_err(a[1], b[1]) < 1e-5, name  # the left-padded row on its own


def test_fully_masked_rows_are_uniform_over_all_keys():
    S, num_pad = 11, 6
    q, k, v = qkv(3, 2, S, 4, 2, 8)
    mask = padded_mask(2, S, num_pad)
    out = jax.jit(blockwise_attention, static_argnums=4)(q, k, v, mask, 4)
    mean_v = jnp.repeat(jnp.mean(v[1], axis=0), 2, axis=0)  # [H, E]: uniform weights over all S keys
    np.testing.assert_allclose(out[1, :num_pad], np.broadcast_to(mean_v, (num_pad, 4, 8)), rtol=1e-6, atol=1e-6)
    assert not np.allclose(out[1, num_pad], mean_v, atol=1e-3)  # first real query: its own softmax


def test_bf16_close_to_eager():
    q, k, v = qkv(4, 2, 40, 4, 2, 16, jnp.bfloat16)
    mask = padded_mask(2, 40, 9)
    out = jax.jit(blockwise_attention, static_argnums=4)(q, k, v, mask, 16)
    assert out.dtype == jnp.bfloat16
    ref = jax.jit(eager_attention)(q, k, v, mask)
    assert rel_err(out.astype(jnp.float32), ref.astype(jnp.float32)) < 2e-2


def test_residuals_are_q_k_v_mask_out_and_fp32_lse():
    B, S, H, K, E = 1, 512, 8, 2, 16
    q, k, v = (jax.ShapeDtypeStruct(x.shape, jnp.bfloat16) for x in qkv(0, B, S, H, K, E))
    mask = jax.ShapeDtypeStruct((B, S), jnp.int32)

    def residuals(fn):
        return jax.eval_shape(lambda *a: jax.tree.leaves(jax.vjp(lambda *x: fn(*x, a[3]), *a[:3])[1]), q, k, v, mask)

    leaves = residuals(attend)
    nbytes = sorted(x.size * x.dtype.itemsize for x in leaves)
    expected = sorted([2 * B * S * H * E] * 2 + [2 * B * S * K * E] * 2 + [4 * B * S, 4 * B * H * S])
    assert nbytes == expected
    assert max(x.size for x in leaves) < S * S
    assert max(x.size for x in residuals(eager_attention)) >= B * H * S * S  # the O(S^2) form it replaces


def compiled_backward_temp_bytes(fn, S, B=1, H=8, K=2, E=32):
    q = jax.ShapeDtypeStruct((B, S, H, E), jnp.float32)
    kv = jax.ShapeDtypeStruct((B, S, K, E), jnp.float32)
    mask = jax.ShapeDtypeStruct((B, S), jnp.int32)

    def backward(q, k, v, m, g):
        return jax.vjp(lambda *a: fn(*a, m), q, k, v)[1](g)

    return jax.jit(backward).lower(q, kv, kv, mask, q).compile().memory_analysis().temp_size_in_bytes


def test_backward_workspace_grows_linearly_in_seq_len():
    block = 128
    blockwise = lambda q, k, v, m: blockwise_attention(q, k, v, m, block)  # noqa: E731
    small, large = (compiled_backward_temp_bytes(blockwise, S) for S in (512, 1024))
    assert large / small < 2.3  # O(S x block); the eager form grows ~4x
    eager = compiled_backward_temp_bytes(eager_attention, 1024)
    assert eager > 8 * 1024 * 1024 * 4  # at least one [H, S, S] fp32 tensor
    assert large < eager / 3


@pytest.mark.slow  # ~15 s of compilation; the default parity tests (tests/model/test_parity.py) use S=12 < one block
def test_parity_with_transformers_beyond_one_block(tmp_path):
    torch = pytest.importorskip("torch")
    S = BLOCK_KEYS + 189  # two blocks, the second partial
    tm = make_torch_model("qwen2-gqa4-untied", seed=0)
    tm.save_pretrained(tmp_path)
    model = lt.load_model(tmp_path)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, (3, S)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, :BLOCK_KEYS + 20] = 0  # left padding: a whole key block of queries that see nothing
    mask[2, S - 50:] = 0  # right padding
    labels = np.where(mask == 1, ids, -100).astype(np.int32)
    ids_t, mask_t, labels_t = (torch.tensor(x, dtype=torch.long) for x in (ids, mask, labels))
    ref = tm(ids_t, attention_mask=mask_t, labels=labels_t)
    ref.loss.backward()
    logits = np.asarray(lt.forward(model, ids, mask))
    valid = mask.astype(bool)
    assert rel_err(logits[valid], ref.logits.detach().numpy()[valid]) < 1e-5
    loss, grads = lt.loss_and_grad(model, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    assert rel_err(loss, ref.loss.item()) < 1e-4
    ref_grads = {n: p.grad.numpy() for n, p in tm.named_parameters()}
    for name, g in lt.to_hf_state_dict(model.config, grads).items():
        assert rel_err(g, ref_grads[name]) < 1e-4, name
