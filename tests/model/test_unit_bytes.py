"""The planner's byte formulas (schedule/costs.py, pure Python) against the real units (model/unit_bytes.py).

Tolerance policy: boundary, residual and head-workspace bytes agree exactly (eval_shape, real shapes,
bf16 and fp32 streams). The backward workspace is a model of XLA's compiled temp bytes: on the CPU
backend in fp32 the measured temp lies in [0.5, 1.1] x the formula (measured 0.69-0.98 on
qwen2.5-0.5b and qwen3-8b shapes). bf16 on the CPU backend is not compared: its dots run in fp32 and
its temps hold fp32 copies of the layer's weights, which a bf16-native accelerator does not make.
"""

import jax
import jax.numpy as jnp
import pytest

from lazytrain_jax.model import attention, unit_bytes
from lazytrain_jax.model.config import get_preset, loss_chunk_tokens
from lazytrain_jax.model.units import get_units
from lazytrain_jax.schedule import costs as costs_mod
from lazytrain_jax.schedule.costs import analytic_costs

REAL = ["qwen2.5-0.5b", "qwen3-8b"]  # qwen2: qkv bias, tied head; qwen3: q/k norm, untied head


def analytic(name, micro, seq_len, stream_dtype, grad_dtype=None):
    return analytic_costs(get_preset(name), batch_size=micro, seq_len=seq_len, device_flops=1e14,
                          stream_dtype=stream_dtype, grad_dtype=grad_dtype)


@pytest.mark.parametrize("stream_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("seq_len", [128, 1024])
@pytest.mark.parametrize("name", REAL)
def test_boundary_residual_and_head_bytes_are_exact(name, seq_len, stream_dtype):
    cfg = get_preset(name)
    for micro in (1, 3):
        c = analytic(name, micro, seq_len, stream_dtype)
        measured = unit_bytes.layer_bytes(cfg, "decoder", micro_batch_size=micro, seq_len=seq_len,
                                          stream_dtype=stream_dtype, workspace="none")
        assert measured.boundary == c.boundary_bytes[1] == c.boundary_bytes[0]
        assert measured.residual == c.residual_bytes[0]
        assert unit_bytes.head_workspace_bytes(cfg, micro_batch_size=micro, seq_len=seq_len,
                                               stream_dtype=stream_dtype) == c.head_workspace_bytes
    p = get_units(cfg).abstract_params("decoder")
    assert c.weight_bytes[1] == sum(x.size for x in jax.tree.leaves(p)) * jnp.dtype(stream_dtype).itemsize


def test_head_workspace_micro_batches_and_loss_chunk_rule():
    cfg = get_preset("qwen2.5-0.5b")
    c = analytic_costs(cfg, batch_size=4, seq_len=1024, device_flops=1e14, num_micro_batches=2)
    assert c.grad_dtype == "bfloat16" and c.stream_dtype == "bfloat16"
    assert c.head_workspace_bytes == unit_bytes.head_workspace_bytes(
        cfg, micro_batch_size=2, seq_len=1024, stream_dtype="bfloat16", num_micro_batches=2)
    chunk = loss_chunk_tokens(cfg.vocab_size, 2048)
    assert chunk == (1 << 28) // (4 * cfg.vocab_size) == 441  # one chunk of fp32 logits <= 256 MiB
    matrix = cfg.vocab_size * cfg.hidden_size + cfg.hidden_size
    assert c.head_workspace_bytes == matrix * (2 + 2 * 4) + 2 * chunk * cfg.vocab_size * 4
    assert analytic("qwen2.5-0.5b", 1, 128, "float32").grad_dtype == "float32"  # follows the stream


def test_residual_formula_counts_every_leaf_of_a_debug_layer():
    # A layer whose every width differs, so a miscounted term cannot hide behind an equal one.
    cfg = get_preset("qwen3-debug", hidden_size=48, intermediate_size=136, num_heads=6, num_kv_heads=2,
                     head_dim=10)
    units = get_units(cfg)
    for stream_dtype in ("bfloat16", "float32"):
        measured = unit_bytes.layer_bytes(cfg, "decoder", micro_batch_size=2, seq_len=7, stream_dtype=stream_dtype,
                                          workspace="none")
        assert measured.residual == 2 * 7 * costs_mod.decoder_residual_bytes_per_token(cfg, stream_dtype)
    assert units.layer_defs  # the units built the decoder kind we measured


def test_attention_block_size_is_the_models():
    assert costs_mod.ATTENTION_BLOCK_KEYS == attention.BLOCK_KEYS


def test_costs_module_imports_no_jax():
    import subprocess
    import sys
    code = "import sys, lazytrain_jax.schedule.costs; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def workspace_ratio(name, micro, seq_len):
    measured = unit_bytes.layer_bytes(get_preset(name), "decoder", micro_batch_size=micro, seq_len=seq_len,
                                      stream_dtype="float32", workspace="compiled")
    assert measured.workspace_source == f"xla:{jax.default_backend()}"
    return measured.workspace / analytic(name, micro, seq_len, "float32").workspace_bytes[0]


def test_workspace_formula_models_compiled_temp_bytes():
    assert 0.5 <= workspace_ratio("qwen2.5-0.5b", 1, 256) <= 1.1


@pytest.mark.slow
@pytest.mark.parametrize("name,micro,seq_len", [("qwen2.5-0.5b", 1, 1024), ("qwen2.5-0.5b", 2, 1024),
                                                ("qwen3-8b", 1, 128), ("qwen3-8b", 1, 1024)])
def test_workspace_formula_models_compiled_temp_bytes_real_shapes(name, micro, seq_len):
    assert 0.5 <= workspace_ratio(name, micro, seq_len) <= 1.1


def test_jaxpr_bound_is_above_the_compiled_workspace():
    cfg = get_preset("qwen3-debug")
    bound = unit_bytes.layer_bytes(cfg, "decoder", micro_batch_size=2, seq_len=48, stream_dtype="float32",
                                   workspace="bound")
    compiled = unit_bytes.layer_bytes(cfg, "decoder", micro_batch_size=2, seq_len=48, stream_dtype="float32")
    assert bound.workspace_source == "jaxpr-bound"
    assert bound.workspace >= compiled.workspace > 0
    assert (bound.boundary, bound.residual) == (compiled.boundary, compiled.residual)


def test_bad_arguments_name_the_field():
    cfg = get_preset("qwen3-debug")
    with pytest.raises(ValueError, match=r"stream_dtype='int8'.*valid"):
        unit_bytes.layer_bytes(cfg, "decoder", micro_batch_size=1, seq_len=8, stream_dtype="int8")
    with pytest.raises(ValueError, match=r"seq_len=0"):
        unit_bytes.layer_bytes(cfg, "decoder", micro_batch_size=1, seq_len=0)
    with pytest.raises(ValueError, match=r"workspace='xla'.*valid"):
        unit_bytes.layer_bytes(cfg, "decoder", micro_batch_size=1, seq_len=8, workspace="xla")
    with pytest.raises(ValueError, match=r"stream_dtype='fp8'.*valid"):
        analytic_costs(cfg, batch_size=1, seq_len=8, device_flops=1e12, stream_dtype="fp8")


def count_dots(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == "dot_general"
        for value in eqn.params.values():
            n += sum(count_dots(sub) for sub in unit_bytes._sub_jaxprs(value))
    return n


@pytest.mark.parametrize("name", ["qwen3-debug", "qwen2-debug"])
def test_backward_from_residuals_recomputes_no_matmul(name):
    # Trimmed residuals must not be paid for with recomputed matmuls: the backward has exactly the
    # 2 x 7 projection matmuls (input and weight gradients) plus the attention backward's 6 (block
    # scores, dv, dp, dq, dk and the row term dO.O).
    cfg = get_preset(name)
    units = get_units(cfg)
    params = units.abstract_params("decoder")
    h = jax.ShapeDtypeStruct((2, 24, cfg.hidden_size), jnp.float32)
    ints = jax.ShapeDtypeStruct((2, 24), jnp.int32)
    _, residuals = jax.eval_shape(units.layer_forward_with_residuals("decoder"), params, h, ints, ints)
    backward = jax.make_jaxpr(units.layer_backward_from_residuals("decoder"))(params, residuals, h)
    forward = jax.make_jaxpr(units.layer("decoder"))(params, h, ints, ints)
    assert count_dots(forward.jaxpr) == 7 + 2  # projections, attention scores and values
    assert count_dots(backward.jaxpr) == 2 * 7 + 6
