"""Tokenizers from local directories only, and a small byte-level BPE trained offline.

``train_tokenizer`` trains a byte-level BPE with the ``tokenizers`` library (digits always split
into single tokens, so numbers are spelled digit by digit) and saves it as a Hugging Face tokenizer
directory that ``transformers.AutoTokenizer.from_pretrained`` loads. Nothing downloads.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterable

from lazytrain_jax.data.jsonl import DataError

EOS_TOKEN = "<|endoftext|>"
CHATML_SPECIALS = ("<|im_start|>", "<|im_end|>")
# ChatML, the format of the Qwen family (without Qwen3's thinking block).
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _offline():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def train_tokenizer(texts: Iterable[str], out_dir: str | os.PathLike, *, vocab_size: int = 320,
                    chat_template: str | None = None) -> str:
    """Trains a byte-level BPE on ``texts`` and saves it as a Hugging Face tokenizer directory.

    Args:
      texts: the training corpus.
      out_dir: written atomically (a temporary directory renamed into place).
      vocab_size: total vocabulary including the 256 byte symbols and the special tokens.
      chat_template: a Jinja chat template to store (e.g. ``CHATML_TEMPLATE``); None: no template.

    Returns:
      ``out_dir``.

    Example:
      >>> train_tokenizer(["What is 1 + 2? The answer is: 3"], "tok", vocab_size=300)
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    import transformers

    specials = [EOS_TOKEN, *CHATML_SPECIALS]
    if vocab_size < 256 + len(specials):
        raise ValueError(f"vocab_size={vocab_size} must be >= {256 + len(specials)} (256 bytes + special tokens)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)
    if chat_template is not None:
        hf.chat_template = chat_template
    out_dir = os.fspath(out_dir)
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        hf.save_pretrained(tmp)
        if os.path.isdir(out_dir):
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def arithmetic_tokenizer(out_dir: str | os.PathLike, *, chat_template: str | None = None) -> str:
    """The demo's tokenizer: trained on synthetic arithmetic problems (digits as single tokens)."""
    from lazytrain_jax.data.synthetic import arithmetic_problems

    problems = arithmetic_problems(num_digits=2)[::7]
    texts = [f"{p.query}\n{p.response}" for p in problems] + [f"Question: {p.query}\nAnswer: {p.response}"
                                                               for p in problems[::5]]
    return train_tokenizer(texts, out_dir, vocab_size=320, chat_template=chat_template)


def load_tokenizer(path: str | os.PathLike):
    """``AutoTokenizer.from_pretrained`` of a local directory (never the Hub).

    Raises:
      DataError: the directory is missing or holds no tokenizer.

    Example:
      >>> tok = load_tokenizer("checkpoints/qwen3-0.6b")
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise DataError(f"tokenizer directory {path!r} does not exist; expected a local Hugging Face tokenizer "
                        f"directory (tokenizer.json / tokenizer_config.json)")
    if not any(os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json",
                                                                "vocab.json", "tokenizer.model")):
        raise DataError(f"tokenizer directory {path!r} holds no tokenizer files (tokenizer.json, "
                        f"tokenizer_config.json, vocab.json or tokenizer.model)")
    _offline()
    import transformers

    try:
        tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot load the tokenizer in {path!r}: {e}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
