"""keep_freed_host_blocks: a freed 20 MB block is reused by the next allocation without page faults
(glibc's default hands it back to the OS and faults it in again). Fresh processes: allocator state is global."""

import json
import subprocess
import sys

import pytest

SCRIPT = """
import json, resource, sys
import numpy as np
if sys.argv[1] == "on":
    from lazytrain_jax.host_alloc import keep_freed_host_blocks
    assert keep_freed_host_blocks()
faults = []
for _ in range(3):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(5_000_000, np.float32)
    del a
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(json.dumps(faults))
"""


def _faults(mode):
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_freed_blocks_are_reused_without_page_faults():
    from lazytrain_jax.host_alloc import keep_freed_host_blocks
    if not keep_freed_host_blocks():
        pytest.skip("no glibc mallopt here")
    on, off = _faults("on"), _faults("off")
    assert on[1] < 10 and on[2] < 10, on          # the second and third 20 MB blocks reuse the first
    assert off[1] > on[1], (off, on)              # the default faults the second one in again


ONCE = """
import inspect, json
from lazytrain_jax import host_alloc
calls, askers = [], []
real, once = host_alloc.keep_freed_host_blocks, host_alloc.keep_host_blocks_once
host_alloc.keep_freed_host_blocks = lambda: calls.append(1) or real()
host_alloc.keep_host_blocks_once = lambda: askers.append(inspect.stack()[1].function) or once()
import lazytrain_jax as lt
from lazytrain_jax.executor.profiler import profile
cfg = lt.get_preset("llama-debug").replace(num_layers=1, layer_kinds=("decoder",))
model = lt.init_model(cfg, seed=0)
costs, hw = profile(model, 1, 8, stream_dtype="float32", device_memory=1e9, repeats=1)
from lazytrain_jax.schedule.api import plan_for_costs
plan = plan_for_costs(costs, hw)
with lt.StreamingEngine(model, plan, stream_dtype="float32"):
    pass
print(json.dumps([once(), len(calls), askers]))
"""


@pytest.mark.parametrize("env,expected", [(None, True), ("0", False)])
def test_profile_and_engine_set_the_allocator_once_unless_told_not_to(env, expected):
    import os
    from lazytrain_jax.host_alloc import keep_freed_host_blocks
    if not keep_freed_host_blocks():
        pytest.skip("no glibc mallopt here")
    environ = {k: v for k, v in os.environ.items() if k != "LAZYTRAIN_KEEP_FREED_HOST_BLOCKS"}
    if env is not None:
        environ["LAZYTRAIN_KEEP_FREED_HOST_BLOCKS"] = env
    out = subprocess.run([sys.executable, "-c", ONCE], capture_output=True, text=True, check=True, env=environ)
    kept, calls, askers = json.loads(out.stdout.strip().splitlines()[-1])
    assert kept is expected
    assert {"profile", "__init__"} <= set(askers), askers   # lt.profile and the engine's constructor ask
    assert calls == (1 if expected else 0)   # glibc was set once at most
