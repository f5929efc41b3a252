"""Loading a sharded ~200 MB checkpoint holds no second copy of the model in host memory."""

import json
import subprocess
import sys

import pytest

import lazytrain_jax as lt
from lazytrain_jax.model.config import ModelConfig

MEASURE = r"""
import json, sys
import numpy as np
import lazytrain_jax as lt
from lazytrain_jax.model import hf_io, units  # import everything the load needs before measuring

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)

lt.load_model(sys.argv[2])  # warm: jax/flax tracing caches, allocator arenas
import gc; gc.collect()
base = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak-RSS counter (VmHWM) to the current RSS
model = lt.load_model(sys.argv[1])
peak = status("VmHWM")
print(json.dumps({"extra": peak - base, "model_bytes": model.num_bytes()}))
"""


def test_sharded_load_peak_memory(tmp_path):
    cfg = ModelConfig(model_type="llama", vocab_size=16000, hidden_size=1024, intermediate_size=2048,
                      num_layers=2, num_heads=8, num_kv_heads=4, head_dim=128)
    model = lt.init_model(cfg, seed=0)
    assert 190e6 < model.num_bytes() < 260e6
    lt.save_hf(model, tmp_path / "big", max_shard_bytes=50 << 20)
    lt.save_hf(lt.init_model(cfg.replace(vocab_size=64, hidden_size=64, intermediate_size=64, num_heads=2,
                                         num_kv_heads=1, head_dim=32)), tmp_path / "small")
    del model
    out = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path / "big"), str(tmp_path / "small")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    ratio = r["extra"] / r["model_bytes"]
    print(f"load extra peak {r['extra'] / 1e6:.1f} MB for {r['model_bytes'] / 1e6:.1f} MB model: {ratio:.3f}x")
    assert ratio <= 1.3, r
