#!/usr/bin/env bash
# Many seeds on one CUDA GPU: K = 256 and K = 1024 CartPole agents and K = 16 Atari agents, one process
# each; prints wall time, env steps/s over all agents, GPU memory peak and seeds solved per run.
#   make setup && benchmarks/gpu_seeds.sh            (from the repository root; extra args go to the driver)
#   benchmarks/gpu_seeds.sh --atari-k 0              (CartPole only)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_seeds.sh: no CUDA GPU visible to torch ($PY: torch.cuda.is_available() is False); run it on a CUDA machine after make setup" >&2
  exit 1
fi
exec "$PY" benchmarks/gpu_seeds.py --device cuda "$@"
