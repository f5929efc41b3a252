"""Blockwise 8-bit storage of Adam moments, with analytic (lookup-free) code maps.

A tensor is flattened in row-major order and cut into blocks of ``block_size`` consecutive
elements (the last block is zero-padded). Each block stores one fp32 scale ``s`` (here, in
:func:`quantize`, the block's absolute maximum; the optimizer may use any ``s`` >= the absmax, see
``kernel._scale_bounds``; every error bound below is relative to ``s``) and one 8-bit code per
element, the codes kept in the tensor's own shape (so ``optax.tree.map_params`` and shardings of
the parameter apply to them).
Scales have shape ``(num_blocks,) + (1,) * (ndim - 1)`` (same rank as the parameter).

Encoding and decoding are a handful of elementwise operations each (no ``searchsorted`` over a
code table: that made a naive 8-bit update 12x slower than fp32 Adam on a 2-core CPU).

Formats (``state_format``):

``"dynamic8"`` (default) -- power-companded integer codes.
    First moment m (signed), int8 code c in [-127, 127]::

        m = s * sign(c) * (|c| / 127)**2

    Second moment v (non-negative), uint8 code c in [0, 255]::

        v = s * (c / 255)**4          (i.e. sqrt(v) = sqrt(s) * (c / 255)**2)

    The encoder returns the value-domain nearest code: it takes k = floor(companded value) and
    picks k or k + 1, whichever *decodes* closer to the input, by comparing the normalized input
    with the midpoint of the two decoded values (ties go to the smaller magnitude; exact up to a
    couple of ulp of the input next to a midpoint, checked against brute force in the tests).
    Worst-case error per block (s = the block's scale):

    * m: |x - dec(x)| <= s * (2|c| + 1) / (2 * 127**2) <= 0.79 % of s; relative to |x|, at most
      (2k + 1) / (2 k**2) for |x| >= s (k / 127)**2 (e.g. <= 0.8 % near the top, <= 8.7 % for
      |x| >= s / 100); |x| < s / (2 * 127**2) = 3.1e-5 s decodes to 0.
    * v: |x - dec(x)| <= s * ((k+1)**4 - k**4) / (2 * 255**4) <= 0.79 % of s; |x| below
      s / (2 * 255**4) = 1.2e-10 s decodes to 0. Relative to sqrt(v) (what Adam divides by) the
      error is at most half the relative error of v.

``"fp8"`` -- float8 codes with per-block scales.
    m: ``float8_e4m3fn(m * 448 / s)``; v: ``float8_e4m3fn(448 * sqrt(v / s))`` (v = s (c/448)**2).
    Round-to-nearest-even in the scaled domain (the encoder's promise). Relative error of the
    scaled value <= 2**-4 = 6.25 % for scaled magnitudes >= 2**-6 (normal range), so sqrt(v) is
    within 6.25 % (v within 13 %); absolute error of m <= 16 / 448 = 3.6 % of s, of v
    <= 2 * 16/448 + (16/448)**2 = 7.3 % of s; scaled values below 2**-10 flush to 0.

``"fp32"`` -- plain float32 moments (no scales).

Exact zero encodes to code 0 and decodes to exactly 0 in every format. Blocks whose absmax is
below ``MIN_SCALE`` (2**-100, about 7.9e-31) are flushed to zero (scale 0, all codes 0): this keeps
1 / s finite for subnormal blocks; Adam moments that small carry no information in fp32 either.
Non-finite input: a NaN or +-inf anywhere in a block makes that block's scale non-finite, and every
element of that block then decodes to NaN (poison is never silently turned into a finite number;
other blocks are unaffected). The optimizer never stores such blocks: a step whose gradient norm is
not finite is skipped. Where v decodes to 0 the optimizer treats m as 0 (no m / eps blow-up from a
second moment that underflowed its block's code range).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

STATE_FORMATS = ("dynamic8", "fp8", "fp32")
MIN_SCALE = 2.0**-100
FP8_MAX = 448.0

_M_LEVELS = 127.0
_V_LEVELS = 255.0
_INV_M2 = 1.0 / (_M_LEVELS * _M_LEVELS)
_INV_V2 = 1.0 / (_V_LEVELS * _V_LEVELS)
_INV_FP8 = 1.0 / FP8_MAX
_RATIO_PRE = 64.0


def check_state_format(state_format: str) -> str:
    """Validates ``state_format`` and returns it; raises ValueError naming the valid formats."""
    if state_format not in STATE_FORMATS:
        raise ValueError(
            f"state_format={state_format!r} is not a known format; valid: {', '.join(STATE_FORMATS)}"
        )
    return state_format


def code_dtypes(state_format: str) -> tuple[jnp.dtype, jnp.dtype]:
    """Storage dtypes ``(m_dtype, v_dtype)`` of a state format.

    Example:
        >>> code_dtypes("dynamic8")
        (dtype('int8'), dtype('uint8'))
    """
    check_state_format(state_format)
    if state_format == "dynamic8":
        return jnp.dtype(jnp.int8), jnp.dtype(jnp.uint8)
    if state_format == "fp8":
        return jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e4m3fn)
    return jnp.dtype(jnp.float32), jnp.dtype(jnp.float32)


def format_of(code_dtype) -> str:
    """The state format a stored moment belongs to, read from its dtype (static under jit)."""
    code_dtype = jnp.dtype(code_dtype)
    if code_dtype in (jnp.dtype(jnp.int8), jnp.dtype(jnp.uint8)):
        return "dynamic8"
    if code_dtype == jnp.dtype(jnp.float8_e4m3fn):
        return "fp8"
    return "fp32"


def num_blocks(size: int, block_size: int) -> int:
    """Number of blocks of ``block_size`` elements that cover ``size`` elements (0 for size 0)."""
    return -(-size // block_size)


def scale_shape(shape: tuple[int, ...], block_size: int) -> tuple[int, ...]:
    """Shape of the per-block scales of a tensor: ``(num_blocks,) + (1,) * (ndim - 1)``."""
    size = math.prod(shape)
    return (num_blocks(size, block_size),) + (1,) * max(len(shape) - 1, 0)


def _to_blocks(x, block_size: int):
    flat = x.reshape(-1)
    pad = num_blocks(flat.size, block_size) * block_size - flat.size
    if pad:
        flat = jnp.pad(flat, (0, pad))
    return flat.reshape(-1, block_size)


def _from_blocks(x_nb, shape):
    size = math.prod(shape)
    flat = x_nb.reshape(-1)
    if flat.size != size:
        flat = flat[:size]
    return flat.reshape(shape)


def block_absmax(x, block_size: int):
    """Per-block max |x| (fp32, shape ``scale_shape``); blocks below MIN_SCALE become 0."""
    a = jnp.max(jnp.abs(_to_blocks(x.astype(jnp.float32), block_size)), axis=1)
    a = jnp.where(a < MIN_SCALE, 0.0, a)
    return a.reshape(scale_shape(x.shape, block_size))


def _ratio(a, s_n1, expand=None):
    """a / s with one multiply per element; 2**6 / s stays a normal float (CPUs flush denormals).

    ``expand`` (optional) maps per-block values to ``a``'s shape; the inverse is taken per block.
    """
    inv = jnp.where(s_n1 > 0, _RATIO_PRE / s_n1, 0.0)
    return (a * (1.0 / _RATIO_PRE)) * _ex(expand, inv)


def _ex(expand, x_n1):
    return x_n1 if expand is None else expand(x_n1)


def _nearest(u, t, top, power4: bool):
    """Value-domain nearest code for normalized magnitudes ``u = |x| / s`` given ``t = f(u)``.

    Picks k = floor(t) or k + 1 by comparing u with the midpoint of their decoded values,
    ``(n(k) + n(k+1)) / 2`` where ``n(k) = (k / top)**2`` (m) or ``(k / top)**4`` (v): a few
    multiplies instead of two full decodes. Exact up to the rounding of ``u`` (a couple of ulp
    of the input at a midpoint).
    """
    k = jnp.clip(jnp.floor(t), 0.0, top - 1.0)
    k1 = k + 1.0
    if power4:
        k2, k12 = k * k, k1 * k1
        up = u * (2.0 * top**4) > k2 * k2 + k12 * k12
    else:
        up = u * (2.0 * top * top) > k * k1 * 2.0 + 1.0
    return jnp.where(up, k1, k)


def encode_m_nb(m_nb, s_nb, state_format: str, expand=None):
    """Encodes first-moment blocks ``[num_blocks, block_size]`` with scales ``[num_blocks, 1]``.

    With ``expand`` (per-block -> ``m_nb``'s shape), ``m_nb`` may have any shape in block order.
    """
    if state_format == "dynamic8":
        u = _ratio(jnp.abs(m_nb), s_nb, expand)
        k = _nearest(u, _M_LEVELS * jnp.sqrt(u), _M_LEVELS, power4=False)
        return jnp.where(m_nb < 0, -k, k).astype(jnp.int8)
    inv = _ex(expand, jnp.where(s_nb > 0, FP8_MAX / s_nb, 0.0))
    y = jnp.clip(m_nb * inv, -FP8_MAX, FP8_MAX)
    return y.astype(jnp.float8_e4m3fn)


def decode_m_nb(c_nb, s_nb, expand=None):
    """Decodes first-moment codes ``[num_blocks, block_size]`` to fp32."""
    if format_of(c_nb.dtype) == "dynamic8":
        k = c_nb.astype(jnp.float32)
        return _ex(expand, s_nb) * ((k * jnp.abs(k)) * _INV_M2)
    return c_nb.astype(jnp.float32) * _ex(expand, s_nb * _INV_FP8)


def encode_v_nb(v_nb, s_nb, state_format: str, expand=None):
    """Encodes second-moment blocks (v >= 0) ``[num_blocks, block_size]`` (``expand``: as above)."""
    if state_format == "dynamic8":
        u = _ratio(v_nb, s_nb, expand)
        return _nearest(u, _V_LEVELS * jnp.sqrt(jnp.sqrt(u)), _V_LEVELS,
                        power4=True).astype(jnp.uint8)
    y = jnp.minimum(FP8_MAX * jnp.sqrt(_ratio(v_nb, s_nb, expand)), FP8_MAX)
    return y.astype(jnp.float8_e4m3fn)


def decode_v_nb(c_nb, s_nb, expand=None):
    """Decodes second-moment codes ``[num_blocks, block_size]`` to fp32."""
    if format_of(c_nb.dtype) == "dynamic8":
        k = c_nb.astype(jnp.float32)
        q = (k * k) * _INV_V2
        return _ex(expand, s_nb) * (q * q)
    r = c_nb.astype(jnp.float32) * _INV_FP8
    return _ex(expand, s_nb) * (r * r)


def decoded_absmax_n1(c_nb, s_n1, signed: bool):
    """Exact per-block max |decoded value| from the codes alone (reductions over 1-byte codes).

    Args:
      c_nb: codes ``[num_blocks, block_size]``; s_n1: scales ``[num_blocks, 1]``.
      signed: first-moment (True) or second-moment (False) map.

    Returns:
      fp32 ``[num_blocks, 1]``.
    """
    if format_of(c_nb.dtype) == "dynamic8":
        top = jnp.max(c_nb, axis=1, keepdims=True).astype(jnp.int32)
        if signed:  # max |c| without materializing |c|
            top = jnp.maximum(top, -jnp.min(c_nb, axis=1, keepdims=True).astype(jnp.int32))
        dec = decode_m_nb if signed else decode_v_nb
        return dec(top.astype(c_nb.dtype), s_n1)
    bits = jax.lax.bitcast_convert_type(c_nb, jnp.uint8)
    if signed:
        bits = bits & jnp.uint8(0x7F)  # e4m3fn: sign bit off; magnitude order == bit order
    top = jax.lax.bitcast_convert_type(jnp.max(bits, axis=1, keepdims=True), jnp.float8_e4m3fn)
    return (decode_m_nb if signed else decode_v_nb)(top, s_n1)


def quantize(x, *, block_size: int, state_format: str = "dynamic8", signed: bool = True):
    """Quantizes a tensor blockwise.

    Args:
      x: the tensor (any float dtype; promoted to fp32).
      block_size: elements per block (> 0).
      state_format: ``"dynamic8"`` or ``"fp8"`` (see the module docstring for the code maps).
      signed: True for the first-moment map (signed), False for the second-moment map (x >= 0).

    Returns:
      ``(codes, scales)``: codes in ``x.shape`` (int8 / uint8 / float8_e4m3fn), fp32 scales of
      shape ``scale_shape(x.shape, block_size)``.

    Example:
      >>> codes, scales = quantize(jnp.linspace(-1, 1, 512), block_size=256)
      >>> y = dequantize(codes, scales, block_size=256, signed=True)
    """
    if state_format not in ("dynamic8", "fp8"):
        raise ValueError(f"state_format={state_format!r} cannot be quantized; valid: dynamic8, fp8")
    x = x.astype(jnp.float32)
    s = block_absmax(x, block_size)
    s_nb = s.reshape(-1, 1)
    x_nb = _to_blocks(x, block_size)
    enc = encode_m_nb if signed else encode_v_nb
    return _from_blocks(enc(x_nb, s_nb, state_format), x.shape), s


def dequantize(codes, scales, *, block_size: int, signed: bool = True):
    """Inverse of :func:`quantize` (fp32 result in ``codes.shape``).

    Example:
      >>> codes, scales = quantize(jnp.ones(300), block_size=128)
      >>> dequantize(codes, scales, block_size=128)  # exactly ones
    """
    dec = decode_m_nb if signed else decode_v_nb
    out = dec(_to_blocks(codes, block_size), scales.reshape(-1, 1))
    return _from_blocks(out, codes.shape)


def to_blocks(x, block_size: int):
    """Flattens and zero-pads ``x`` to ``[num_blocks, block_size]``."""
    return _to_blocks(x, block_size)


def from_blocks(x_nb, shape):
    """Inverse of :func:`to_blocks` (drops the padding)."""
    return _from_blocks(x_nb, shape)


def all_codes(state_format: str, signed: bool):
    """Every valid code of a format, as a 1-D array of the code dtype (for brute-force tests)."""
    check_state_format(state_format)
    if state_format == "dynamic8":
        if signed:
            return jnp.arange(-127, 128, dtype=jnp.int32).astype(jnp.int8)
        return jnp.arange(0, 256, dtype=jnp.int32).astype(jnp.uint8)
    if state_format == "fp8":
        bits = jnp.arange(256, dtype=jnp.int32).astype(jnp.uint8)
        vals = jax.lax.bitcast_convert_type(bits, jnp.float8_e4m3fn)
        keep = jnp.isfinite(vals.astype(jnp.float32))
        if not signed:
            keep = keep & (vals.astype(jnp.float32) >= 0)
        return vals[keep]
    raise ValueError("state_format='fp32' has no codes")
