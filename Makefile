# pipeline: `make run` sets everything up and runs the main job; `make test` sets up and runs the tests.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch is installed first and pinned: an unpinned torch pulls a multi-GB CUDA build.
TORCH := torch==2.13.0
EXPERIMENT ?= dqn_cartpole
ARGS ?=

.PHONY: help setup run test test-long test-fast mutate bench bench-jax bench-ddp bench-atari-cleanrl bench-cleanrl bench-offpolicy-cleanrl bench-tune lint clean headless-gl cluster-up cluster-down

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev,mujoco,onnx,envpool]"
	bash tools/headless_gl.sh || echo "headless GL not installed: MuJoCo videos need a display (make headless-gl as root)"
	touch $(STAMP)

setup: $(STAMP) ## create .venv and install the project (once; again when pyproject.toml changes)

run: $(STAMP) ## run the main job (EXPERIMENT=dqn_cartpole, ARGS="seed=1 ...")
	$(PY) -m pipeline experiment=$(EXPERIMENT) $(ARGS)

# Tests run in JOBS pytest-xdist workers (default 2, the cores of the machine we size the suite for; JOBS=1
# runs them in one process). --dist loadgroup keeps the cluster tests on one worker, one at a time.
JOBS ?= 2
XDIST = $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadgroup)

test: $(STAMP) ## run the test suite (JOBS=2 workers), all but the tests marked long
	$(PY) -m pytest -q -m "not long" $(XDIST) $(ARGS)

test-long: $(STAMP) ## the tests marked long (cold torch.compile; CI runs them after make test)
	$(PY) -m pytest -q -m long $(XDIST) $(ARGS)

test-fast: $(STAMP) ## the suite without the tests marked slow (each over ~5 s) or long
	$(PY) -m pytest -q -m "not slow and not long" $(XDIST) $(ARGS)

mutate: $(STAMP) ## mutation score of the 21 core modules (~15 min on 2 cores; ARGS="rl/replay.py", "--stable" or "--all": hours)
	$(PY) tools/mutate.py $(ARGS)

bench: $(STAMP) ## speed benchmarks, as ratios against a reference run in the same invocation
	$(PY) benchmarks/run.py $(ARGS)

bench-jax: $(STAMP) ## PPO and DQN CartPole against PureJaxRL, one core each: identical recipe (K=16/64/256, CPU s per env step and per backpropagated sample, compile apart) and per solved seed (own .venv-jax)
	$(PY) benchmarks/bench_jax.py $(ARGS)

bench-ddp: $(STAMP) ## one run on 1 and 2 processes (trainer=ddp, gloo on CPU): wall time per epoch, as a ratio
	$(PY) benchmarks/bench_ddp.py --repeats 3 $(ARGS)

bench-atari-cleanrl: $(STAMP) ## PPO Atari (Pong), K=1 and K=4 against CleanRL's ppo_atari_envpool.py: env steps per CPU second, one core (own venv under outputs/; ~10 min)
	$(PY) benchmarks/bench_atari_cleanrl.py $(ARGS)

bench-cleanrl: $(STAMP) ## PPO Pendulum, 16 seeds x 1M steps: the pipeline against CleanRL's ppo_continuous_action.py (own .venv-cleanrl; ~2.5 h on one core)
	$(PY) benchmarks/bench_cleanrl.py $(ARGS)

bench-offpolicy-cleanrl: $(STAMP) ## SAC and TD3 on HalfCheetah and Hopper (v4), 4 seeds x 100k steps a side: the pipeline against CleanRL, each run appended to benchmarks/results/offpolicy_cleanrl.jsonl (own venv under outputs/; ~10 CPU hours; ARGS="--report", "--smoke")
	$(PY) benchmarks/bench_offpolicy_cleanrl.py $(ARGS)

bench-tune: $(STAMP) ## tune dqn_cartpole over seed distributions, then confirm on fresh seeds (~20 minutes on 2 cores)
	$(PY) benchmarks/tune_dqn.py $(ARGS)

lint: $(STAMP) ## ruff, and the layer contracts of pyproject.toml (import-linter)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports

headless-gl: ## EGL for MuJoCo's video frames on a machine without a display (apt, as root; make setup runs it)
	bash tools/headless_gl.sh

cluster-up: ## a one-node SLURM cluster (with accounting) and PostgreSQL on this machine, for the tests marked cluster (root)
	bash tools/cluster/up.sh

cluster-down: ## stop what cluster-up started (and only that)
	bash tools/cluster/down.sh

clean: ## remove outputs and caches (keeps .venv)
	rm -rf outputs multirun wandb lightning_logs .pytest_cache .ruff_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
