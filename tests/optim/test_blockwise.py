"""The blockwise code maps: brute-force nearest code, documented error bounds, special values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lazytrain_jax.optim import blockwise as q

BLOCK = 64


def _blocks_across_magnitudes(seed, signed):
    """Blocks of random values spanning magnitudes, plus zeros, subnormals, extremes, constants."""
    rng = np.random.default_rng(seed)
    rows = []
    for exp in range(-35, 38, 4):  # each block one magnitude, with a wide spread inside it
        row = rng.standard_normal(BLOCK) * 10.0 ** (exp + rng.uniform(-4, 0, BLOCK))
        rows.append(row)
    rows.append(np.zeros(BLOCK))
    rows.append(rng.standard_normal(BLOCK) * 1e-40)  # subnormal-only block: flushed
    mixed = rng.standard_normal(BLOCK)
    mixed[::3] = 1e-40  # subnormals inside a normal block
    mixed[::5] = 0.0
    rows.append(mixed)
    rows.append(np.full(BLOCK, 3.4e38) * np.sign(rng.standard_normal(BLOCK)))  # largest values
    rows.append(np.full(BLOCK, -0.37))  # all-equal block
    rows.append(np.full(BLOCK, 1.17549435e-38))  # smallest normal
    x = np.stack(rows).astype(np.float32)
    return x if signed else np.abs(x)


def _decoded_table(state_format, signed, scales_n1):
    codes = q.all_codes(state_format, signed)
    dec = q.decode_m_nb if signed else q.decode_v_nb
    table = dec(jnp.broadcast_to(codes, (scales_n1.shape[0], codes.shape[0])), scales_n1)
    return codes, table


@pytest.mark.parametrize("signed", [True, False], ids=["m_signed", "v_unsigned"])
def test_dynamic8_codes_are_value_domain_nearest(signed):
    x = jnp.asarray(_blocks_across_magnitudes(0, signed))
    codes, scales = q.quantize(x, block_size=BLOCK, state_format="dynamic8", signed=signed)
    assert codes.dtype == (jnp.int8 if signed else jnp.uint8)
    s_n1 = scales.reshape(-1, 1)
    all_codes, table = _decoded_table("dynamic8", signed, s_n1)
    err_all = jnp.abs(x[:, :, None] - table[:, None, :])  # fp32, same arithmetic as the encoder
    min_err = jnp.min(err_all, axis=-1)
    dec = q.dequantize(codes, scales, block_size=BLOCK, signed=signed)
    err = jnp.abs(x - dec)
    # the promise: nearest, up to a few ulp of the input next to a midpoint between two codes
    ulp = jnp.abs(x) * 2.0**-23
    assert bool(jnp.all(err <= min_err + 4 * ulp))
    assert float(jnp.mean(err == min_err)) > 0.999
    # where the nearest code is unique (and not a near-tie), it is exactly the encoder's code
    best = all_codes[jnp.argmin(err_all, axis=-1)]
    unique = jnp.sum(err_all <= min_err[..., None] + 4 * ulp[..., None], axis=-1) == 1
    assert np.array_equal(np.asarray(codes)[np.asarray(unique)],
                          np.asarray(best)[np.asarray(unique)])
    live = jnp.broadcast_to(s_n1 > 0, x.shape)  # flushed blocks decode every code to 0 (ties)
    assert float(jnp.sum(unique & live) / jnp.sum(live)) > 0.99


@pytest.mark.parametrize("signed", [True, False], ids=["m_signed", "v_unsigned"])
def test_fp8_codes_are_nearest_in_scaled_domain(signed):
    x = jnp.asarray(_blocks_across_magnitudes(1, signed))
    codes, scales = q.quantize(x, block_size=BLOCK, state_format="fp8", signed=signed)
    assert codes.dtype == jnp.float8_e4m3fn
    s_n1 = scales.reshape(-1, 1)
    if signed:
        y = jnp.clip(x * jnp.where(s_n1 > 0, q.FP8_MAX / s_n1, 0.0), -q.FP8_MAX, q.FP8_MAX)
    else:
        y = jnp.minimum(q.FP8_MAX * jnp.sqrt(q._ratio(x, s_n1)), q.FP8_MAX)
    vals = q.all_codes("fp8", signed).astype(jnp.float32)
    min_err = jnp.min(jnp.abs(y[:, :, None] - vals), axis=-1)
    err = jnp.abs(y - codes.astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(err), np.asarray(min_err))


@pytest.mark.parametrize("fmt", ["dynamic8", "fp8"])
@pytest.mark.parametrize("signed", [True, False], ids=["m_signed", "v_unsigned"])
def test_zero_exact_flush_and_extremes(fmt, signed):
    x = _blocks_across_magnitudes(2, signed)
    codes, scales = q.quantize(jnp.asarray(x), block_size=BLOCK, state_format=fmt, signed=signed)
    dec = np.asarray(q.dequantize(codes, scales, block_size=BLOCK, signed=signed))
    assert np.all(dec[x == 0] == 0)
    assert np.all(np.isfinite(dec))
    assert np.all(dec[-5] == 0) and float(scales[-5].squeeze()) == 0.0  # subnormal block flushed
    np.testing.assert_allclose(dec[-2], x[-2], rtol=1e-6)  # all-equal block round-trips
    np.testing.assert_allclose(dec[-3], x[-3], rtol=1e-6)  # the largest finite values


@pytest.mark.parametrize("signed", [True, False], ids=["m_signed", "v_unsigned"])
def test_dynamic8_documented_error_bound(signed):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((256, 256)) * 10.0 ** rng.uniform(-3, 1, (256, 256))
    x = jnp.asarray((x if signed else np.abs(x)).astype(np.float32))
    codes, scales = q.quantize(x, block_size=256, state_format="dynamic8", signed=signed)
    dec = q.dequantize(codes, scales, block_size=256, signed=signed)
    s = jnp.broadcast_to(scales.reshape(-1, 1), x.shape)
    err = jnp.abs(x - dec)
    assert float(jnp.max(err / s)) <= 0.0079  # <= 0.79 % of the block absmax
    if signed:
        k = jnp.abs(codes.astype(jnp.float32))
        bound = s * (2 * k + 1) / (2 * 127.0**2)
        big = jnp.abs(x) >= s / 100
        assert float(jnp.max(jnp.where(big, err / jnp.abs(x), 0.0))) <= 0.087
    else:
        k = codes.astype(jnp.float32)
        kmax = jnp.minimum(k + 1, 255.0)
        bound = s * jnp.maximum(kmax**4 - k**4, k**4 - jnp.maximum(k - 1, 0) ** 4) / (2 * 255.0**4)
    assert bool(jnp.all(err <= bound * (1 + 1e-5) + 1e-30))


@pytest.mark.parametrize("signed", [True, False], ids=["m_signed", "v_unsigned"])
def test_fp8_documented_relative_error(signed):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((64, 256)) * 10.0 ** rng.uniform(-2, 1, (64, 256))
    x = jnp.asarray((x if signed else np.abs(x)).astype(np.float32))
    codes, scales = q.quantize(x, block_size=256, state_format="fp8", signed=signed)
    dec = q.dequantize(codes, scales, block_size=256, signed=signed)
    s = jnp.broadcast_to(scales.reshape(-1, 1), x.shape)
    # compare in the stored (scaled) domain: m * 448 / s, or 448 * sqrt(v / s)
    y = x * 448 / s if signed else 448 * jnp.sqrt(x / s)
    yd = dec * 448 / s if signed else 448 * jnp.sqrt(dec / s)
    normal = jnp.abs(y) >= 2.0**-6
    rel = jnp.where(normal, jnp.abs(y - yd) / jnp.abs(y), 0.0)
    assert float(jnp.max(rel)) <= 2.0**-4 * (1 + 1e-5)
    assert float(jnp.max(jnp.abs(x - dec) / s if signed else 0.0)) <= 16 / 448 + 1e-6


@pytest.mark.parametrize("fmt", ["dynamic8", "fp8"])
def test_nonfinite_poisons_its_block_only(fmt):
    x = np.linspace(-1, 1, 3 * BLOCK).astype(np.float32)
    x[5] = np.nan
    x[BLOCK + 7] = np.inf
    codes, scales = q.quantize(jnp.asarray(x), block_size=BLOCK, state_format=fmt)
    dec = np.asarray(q.dequantize(codes, scales, block_size=BLOCK))
    assert np.all(np.isnan(dec[: 2 * BLOCK]))
    assert np.all(np.isfinite(dec[2 * BLOCK:]))


def test_codes_keep_param_shape_and_padding():
    x = jnp.asarray(np.random.default_rng(5).standard_normal((7, 45)).astype(np.float32))
    codes, scales = q.quantize(x, block_size=BLOCK)
    assert codes.shape == x.shape
    assert scales.shape == (5, 1)  # ceil(315 / 64) blocks, same rank as the tensor
    dec = q.dequantize(codes, scales, block_size=BLOCK)
    assert dec.shape == x.shape
    assert float(jnp.max(jnp.abs(dec - x))) < 0.0079 * float(jnp.max(jnp.abs(x)))


def test_bad_format_raises():
    with pytest.raises(ValueError, match="state_format='int4'"):
        q.quantize(jnp.ones(4), block_size=4, state_format="int4")
    with pytest.raises(ValueError, match="valid: dynamic8, fp8, fp32"):
        q.check_state_format("bogus")


def test_jit_matches_eager():
    x = jnp.asarray(np.random.default_rng(6).standard_normal(1000).astype(np.float32))
    f = jax.jit(lambda t: q.quantize(t, block_size=BLOCK))
    c1, s1 = f(x)
    c2, s2 = q.quantize(x, block_size=BLOCK)
    np.testing.assert_array_equal(np.asarray(c1), np.asarray(c2))
    np.testing.assert_array_equal(np.asarray(s1), np.asarray(s2))
