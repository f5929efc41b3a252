import pytest

from tests.train.helpers import tokenizer_dir


@pytest.fixture(scope="session")
def tok():
    from lazytrain_jax.data import load_tokenizer
    return load_tokenizer(tokenizer_dir())
