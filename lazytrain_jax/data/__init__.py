"""Data: MetaMathQA-format JSONL, synthetic arithmetic, tokenizers, encoding, batching, exact-match eval.

Example:
    >>> from lazytrain_jax import data
    >>> train_set = data.load_dataset("train.jsonl", "tokenizer_dir", seq_len=512)
    >>> loader = data.BatchLoader(train_set.encoded, batch_size=8, seed=0)
"""

from lazytrain_jax.data.answers import extract_answer, is_correct, normalize_answer
from lazytrain_jax.data.dataset import Dataset, load_dataset
from lazytrain_jax.data.encode import EncodedData, PromptFormat, encode_dataset, encode_prompts
from lazytrain_jax.data.evaluate import EvalResult, exact_match
from lazytrain_jax.data.jsonl import DataError, Example, JsonlData, read_jsonl, write_jsonl
from lazytrain_jax.data.loader import BatchLoader
from lazytrain_jax.data.synthetic import arithmetic_example, arithmetic_problems, arithmetic_splits
from lazytrain_jax.data.tokenizer import CHATML_TEMPLATE, arithmetic_tokenizer, load_tokenizer, train_tokenizer

__all__ = ["CHATML_TEMPLATE", "DataError", "Dataset", "EncodedData", "EvalResult", "Example", "JsonlData",
           "BatchLoader", "PromptFormat", "arithmetic_example", "arithmetic_problems", "arithmetic_splits",
           "arithmetic_tokenizer", "encode_dataset", "encode_prompts", "exact_match", "extract_answer",
           "is_correct", "load_dataset", "load_tokenizer", "normalize_answer", "read_jsonl", "train_tokenizer",
           "write_jsonl"]
