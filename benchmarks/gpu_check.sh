#!/usr/bin/env bash
# GPU check: streaming engine (Qwen2.5-3B shape, bf16) and the 8-bit optimizer on the accelerator.
# Needs jax with CUDA (pip install -e . && pip install "jax[cuda12]"); prints one table; ~5-8 minutes.
# Without a GPU it is a CPU dry run of the same code on a tiny model (qwen3-debug, a 2.2 MB budget), a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python -c "import jax, sys; sys.exit(jax.devices()[0].platform != 'gpu')"; then
  echo "no GPU: a CPU dry run on a tiny model (the figures say nothing about a GPU)"
  exec python benchmarks/gpu_check.py --preset qwen3-debug --batch 2 --seq 64 --budget-gb 0.0022 --repeats 1 \
    --opt-params "${OPT_PARAMS:-4000000}" --trace-dir "${TRACE_DIR:-}"
fi
timeout 60 python benchmarks/transfer_paths.py --mb 256 --pieces 8 --repeats 5 || echo "transfer_paths failed or timed out"
# the same paths with huge pages for glibc's large host blocks (as the command and gpu_check.py run)
echo "with GLIBC_TUNABLES=glibc.malloc.hugetlb=1:"
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 timeout 60 python benchmarks/transfer_paths.py --mb 256 --pieces 8 --repeats 5 \
  || echo "transfer_paths (huge pages) failed or timed out"
# the host step of the tied embedding (fp32 Adam state by default) on this host's CPU: XLA against
# the native kernel's fp32 loop (the first forward item waits for it every step)
JAX_PLATFORMS=cpu timeout 60 python benchmarks/optimizer_cpu.py --embedding 151936x2048 --repeats 5 \
  || echo "optimizer_cpu --embedding failed or timed out"
# a 3B layer's host step on bf16 gradients: read as they are against cast to fp32 first
JAX_PLATFORMS=cpu timeout 40 python benchmarks/optimizer_cpu.py --bf16-grads 77M --repeats 5 \
  || echo "optimizer_cpu --bf16-grads failed or timed out"
timeout "${CHECK_TIMEOUT:-420}" python benchmarks/gpu_check.py --preset "${PRESET:-qwen2.5-3b}" --batch "${BATCH:-4}" --seq "${SEQ:-1024}" --budget-gb "${BUDGET_GB:-24}" --trace-dir "${TRACE_DIR:-}"
