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
