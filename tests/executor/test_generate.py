"""Layer-streamed greedy generation against the resident KV-cache decoder: same tokens, the weights
crossing once per decoder call for the whole batch, and the decoder chosen from the device budget."""

import jax
import numpy as np
import pytest

import lazytrain_jax as lt
from lazytrain_jax.executor.generate import StreamedDecoder, choose_decoder, generation_bytes
from lazytrain_jax.model.generate import ResidentDecoder, generate, generate_batch


def _model_and_prompts(preset="qwen3-debug", num_layers=3, tied=True):
    model = lt.init_model(lt.get_preset(preset, num_layers=num_layers, tie_word_embeddings=tied), seed=5)
    rng = np.random.default_rng(2)
    return model, [list(rng.integers(1, model.config.vocab_size, n)) for n in (4, 9, 1, 6, 7)]


@pytest.mark.parametrize("preset, tied, kv_cache", [("qwen3-debug", True, "device"), ("qwen2-debug", False, "host"),
                                                     pytest.param("qwen3-debug", True, "host", marks=pytest.mark.slow),
                                                     pytest.param("qwen2-debug", False, "device", marks=pytest.mark.slow)])
def test_streamed_tokens_equal_resident(kv_cache, preset, tied):
    model, prompts = _model_and_prompts(preset, tied=tied)
    steps = 7
    ref, ref_logits = generate_batch(model, prompts, max_new_tokens=steps, eos_token_ids=[], return_logits=True)
    decoder = StreamedDecoder(model, kv_cache=kv_cache)
    out, logits = generate_batch(model, prompts, max_new_tokens=steps, eos_token_ids=[], decoder=decoder,
                                 return_logits=True)
    assert out == ref and all(len(x) == steps for x in out)
    assert np.abs(logits - ref_logits).max() <= 1e-5 * np.abs(ref_logits).max()
    # one prefill and steps - 1 decode calls; each uploads every layer and the head once for the batch
    params = model.params
    per_call = sum(np.asarray(x).nbytes for x in jax.tree.leaves(params["layers"]) + jax.tree.leaves(params["head"]))
    if tied:
        per_call += sum(np.asarray(x).nbytes for x in jax.tree.leaves(params["embed"]))
    assert decoder.num_calls == steps
    assert decoder.uploaded_weight_bytes == steps * per_call


def test_streamed_generate_batches_and_eos_agree_with_resident():
    model, prompts = _model_and_prompts()
    ref = generate(model, prompts, max_new_tokens=5, eos_token_ids=[], batch_size=2)
    eos = ref[1][2]
    for kv_cache in ("device", "host"):
        decoder = StreamedDecoder(model, kv_cache=kv_cache)
        assert generate(model, prompts, max_new_tokens=5, eos_token_ids=[], batch_size=2, decoder=decoder) == ref
        cut = generate(model, prompts, max_new_tokens=5, eos_token_ids=[eos], batch_size=2, decoder=decoder)
        assert cut == [r[:r.index(eos)] if eos in r else r for r in ref]


def test_choose_decoder_follows_the_byte_model():
    model, _ = _model_and_prompts()
    shape = dict(num_rows=8, prompt_len=12, max_new_tokens=6)
    need = generation_bytes(model, **shape)
    assert need.weights == model.num_params() * 4 and need.kv_cache == model.config.num_layers * need.kv_layer
    assert need.streamed("host") < need.streamed("device") < need.resident()
    cases = [(None, ResidentDecoder, "resident"), (need.resident(), ResidentDecoder, "resident"),
             (need.resident() - 1, StreamedDecoder, "streamed, KV cache on device"),
             (need.streamed("device") - 1, StreamedDecoder, "streamed, KV cache on host")]
    for budget, kind, how in cases:
        decoder, text, rows = choose_decoder(model, device_memory=budget, **shape)
        assert isinstance(decoder, kind) and text == how and rows == 8, (budget, text, rows)
        if kind is StreamedDecoder:
            assert decoder.kv_cache == how.rsplit(" ", 1)[1]
    # below the host-cache form for 8 rows: the batch halves until a form fits
    decoder, text, rows = choose_decoder(model, device_memory=need.streamed("host") - 1, **shape)
    half = generation_bytes(model, 4, shape["prompt_len"], shape["max_new_tokens"])
    assert rows == 4 and half.streamed("host") <= need.streamed("host") - 1 < half.resident()
    one = generation_bytes(model, 1, shape["prompt_len"], shape["max_new_tokens"])
    with pytest.raises(ValueError, match=r"does not fit device_memory=.* even for one prompt"):
        choose_decoder(model, device_memory=one.streamed("host") - 1, **shape)
    with pytest.raises(ValueError, match=r"device_memory=-1 must be a number of bytes > 0"):
        choose_decoder(model, device_memory=-1, **shape)
    with pytest.raises(ValueError, match=r"kv_cache='disk' is not valid; valid: \['device', 'host'\]"):
        StreamedDecoder(model, kv_cache="disk")


def test_exact_match_streamed_equals_resident():
    from lazytrain_jax.data import exact_match
    from lazytrain_jax.data.encode import encode_prompts
    from tests.train.helpers import FMT, tiny_setup

    model, ds, held = tiny_setup(num_train=8, num_eval=6, num_layers=3)
    resident = exact_match(model, held, ds.tokenizer, fmt=FMT, max_new_tokens=6, batch_size=4)
    prompts = encode_prompts(ds.tokenizer, [ex.query for ex in held], FMT)
    need = generation_bytes(model, num_rows=4, prompt_len=max(map(len, prompts)), max_new_tokens=6)
    for budget, how in ((need.resident() - 1, "streamed, KV cache on device"),
                        (need.streamed("device") - 1, "streamed, KV cache on host")):
        streamed = exact_match(model, held, ds.tokenizer, fmt=FMT, max_new_tokens=6, batch_size=4,
                               device_memory=budget)
        assert streamed.decoder == how and resident.decoder == "resident"
        assert streamed.batch_size == resident.batch_size == 4
        assert (streamed.num_correct, streamed.samples) == (resident.num_correct, resident.samples)
