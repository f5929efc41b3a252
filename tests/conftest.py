import gc
import os
import shutil
import tempfile

import pytest

# Tests run on the CPU backend; keep XLA from grabbing every core's worth of threads per test.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The suite compiles about 2,000 tiny programs and runs each for milliseconds: compiling was two
# thirds of its time, and LLVM's optimizations a third of that. They are off here (subprocesses
# inherit it), except in tests marked ``xla_optimized``; JAX_DISABLE_MOST_OPTIMIZATIONS=0 keeps them
# on everywhere.
_ALL_OPTIMIZED = os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS") == "0"
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# Many tests compile the same programs (a tiny layer's forward and backward, one optimizer step)
# in fresh jitted closures, in two worker processes and in subprocesses: a compilation cache on
# disk, shared by all of them for this run, compiles each once. Its key holds the program, the
# compile options (XLA's optimization level among them) and the jaxlib version. Set
# JAX_COMPILATION_CACHE_DIR to keep one across runs; otherwise it is a temporary directory that the
# process which made it removes at the end.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="lazytrain-test-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Removes this run's compilation cache (in the process that made it), and takes the full
    garbage collection pytest then makes five times over (its unraisable-exception plugin's
    cleanup) down to one: the collection here, then every survivor frozen (``gc.freeze``), so
    that the five walk nothing. Each full collection took 0.5-0.8 s at the end of a worker's
    share of the suite; the five, with the rest of a worker's teardown, reached the 5 s that
    pytest-xdist's transport (execnet) waits before it sends the worker SIGINT (in each of 3 full
    runs), and its KeyboardInterrupt was printed from inside JAX's garbage-collection callback.
    What only a later pass would have freed (garbage a finalizer makes during this one) is now
    frozen instead, and an exception its finalizer would raise goes unreported; the process is
    about to exit."""
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
    gc.collect()
    gc.freeze()


_OPTIMIZED = [_ALL_OPTIMIZED]  # whether this process compiles with XLA's optimizations now


@pytest.fixture(autouse=True)
def _xla_optimizations(request):
    """Switches XLA's optimizations on for a test marked ``xla_optimized`` and off for any other,
    where the mode changes. The flag is not part of JAX's compilation caches' keys: they are
    cleared at each switch, so no program compiled in one mode runs in the other."""
    wanted = _ALL_OPTIMIZED or request.node.get_closest_marker("xla_optimized") is not None
    if wanted != _OPTIMIZED[0]:
        import jax

        jax.config.update("jax_disable_most_optimizations", not wanted)
        jax.clear_caches()
        _OPTIMIZED[0] = wanted
    yield


def pytest_collection_finish(session):
    """Moves what the collection made (the test modules and everything they import: jax, torch,
    transformers; about 400,000 objects in each pytest-xdist worker) out of the garbage
    collector's generations. Those objects live as long as the process, and every full
    collection walked them again: a worker's collections of over 0.2 s took 34 s of its run
    before, 13-20 s after (one traced run before, three after)."""
    gc.collect()
    gc.freeze()
