#!/usr/bin/env bash
# Every preset on one CUDA GPU (device=cuda), many seeds per process, in one call: the identical-recipe PPO/DQN runs
# (eager and device.compile=true), the CartPole, Acrobot, Pendulum, MuJoCo and Atari presets, CEM, supervised, GAN and
# auction presets; prints per-sample throughput and cost per solved seed tables (benchmarks/gpu_seeds.py's docstring).
#   make setup && benchmarks/gpu_seeds.sh                 (from the repository root; extra args go to the driver)
#   benchmarks/gpu_seeds.sh --only ppo_recipe ppo_atari   (some runs)
#   .venv/bin/python benchmarks/gpu_seeds.py --device cpu --smoke   (the code path on CPU, no GPU needed)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_seeds.sh: no CUDA GPU visible to torch ($PY: torch.cuda.is_available() is False); run it on a CUDA machine after make setup" >&2
  exit 1
fi
exec "$PY" benchmarks/gpu_seeds.py --device cuda "$@"
