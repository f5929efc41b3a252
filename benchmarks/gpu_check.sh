#!/usr/bin/env bash
# GPU check: streaming engine (Qwen2.5-3B shape, bf16) and the 8-bit optimizer on the accelerator.
# Needs jax with CUDA (pip install -e . && pip install "jax[cuda12]"); prints one table; ~5-8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import jax; d = jax.devices()[0]; assert d.platform == 'gpu', f'no GPU: {d}'; print(d)"
timeout 480 python benchmarks/gpu_check.py --preset "${PRESET:-qwen2.5-3b}" --batch "${BATCH:-4}" --seq "${SEQ:-1024}" --budget-gb "${BUDGET_GB:-24}"
