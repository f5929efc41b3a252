#!/usr/bin/env bash
# GPU check: streaming engine (Qwen2.5-3B shape, bf16) and the 8-bit optimizer on the accelerator.
# Needs jax with CUDA (pip install -e . && pip install "jax[cuda12]"); prints one table; ~5-8 minutes.
# Without a GPU it runs the optimizer check alone as a small CPU dry run (same code, same checks).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python -c "import jax, sys; sys.exit(jax.devices()[0].platform != 'gpu')"; then
  echo "no GPU: CPU dry run of the optimizer check only (4M params)"
  exec python benchmarks/gpu_check.py --optimizer-only --opt-params "${OPT_PARAMS:-4000000}"
fi
timeout 480 python benchmarks/gpu_check.py --preset "${PRESET:-qwen2.5-3b}" --batch "${BATCH:-4}" --seq "${SEQ:-1024}" --budget-gb "${BUDGET_GB:-24}"
