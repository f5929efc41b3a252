import os

import pytest

# Tests run on the CPU backend; keep XLA from grabbing every core's worth of threads per test.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The suite compiles about 2,000 tiny programs and runs each for milliseconds: compiling was two
# thirds of its time, and LLVM's optimizations a third of that. They are off here (subprocesses
# inherit it), except in tests marked ``xla_optimized``; JAX_DISABLE_MOST_OPTIMIZATIONS=0 turns
# them on everywhere.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "xla_optimized: compiled with XLA's optimizations (bit-for-bit comparisons of two "
        "differently fused programs hold for optimized code only; long-running programs run faster)")


@pytest.fixture(autouse=True)
def _xla_optimizations(request):
    if request.node.get_closest_marker("xla_optimized") is None:
        yield
        return
    import jax

    # the flag is not part of JAX's compilation caches' keys: what was compiled without
    # optimizations is dropped before the test, and what the test compiled with them after it
    before = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", False)
    jax.clear_caches()
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
        jax.clear_caches()
