"""PureJaxRL's PPO on CartPole-v1, K seeds at once, timed and evaluated: the JAX side of `make bench-jax`.

Runs in the benchmark's own virtualenv (jax, flax, optax, gymnax, distrax: never the pipeline's), against a
scratch copy of PureJaxRL (`--purejaxrl <dir>`, the folder holding `ppo.py` and `wrappers.py`; fetched by
`benchmarks/bench_jax.py`, never vendored). Nothing of PureJaxRL is rewritten here: its `make_train` and
`ActorCritic` are imported, and its published defaults are read from its own `ppo.py` (the `config` dict of
its `__main__` block), with DEBUG off (a per-step print) and the seed count ours.

    python benchmarks/purejaxrl_ppo.py --purejaxrl <dir> --k 16 --seed 0 --out result.json

What it does, as PureJaxRL's README does: `jax.jit(jax.vmap(make_train(config)))` over K PRNG keys. The
compile is timed on its own (`.lower(keys).compile()`), then the compiled call (blocked until done). Each
trained agent then plays 10 fresh episodes greedily (the mode of its categorical policy; gymnax's CartPole-v1
ends at 500 steps): a seed is solved when that mean reaches 475, the pipeline's own test.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
from pathlib import Path

EVAL_EPISODES = 10
SOLVED = 475.0


def published_config(ppo_file: Path) -> dict:
    """The `config = {...}` literal of ppo.py's `__main__` block: PureJaxRL's own defaults, not a transcription."""
    tree = ast.parse(ppo_file.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "config" for t in stmt.targets):
                    return ast.literal_eval(stmt.value)
    raise SystemExit(f"error: no `config = {{...}}` in the __main__ block of {ppo_file}: is this PureJaxRL's ppo.py?")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--purejaxrl", required=True, help="folder with PureJaxRL's ppo.py and wrappers.py")
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-timesteps", type=float, default=None, help="default: PureJaxRL's own")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    src = Path(args.purejaxrl)
    if not (src / "ppo.py").is_file():
        raise SystemExit(f"error: {src}/ppo.py not found: pass PureJaxRL's purejaxrl/ folder as --purejaxrl")
    sys.path.insert(0, str(src))
    t_import = time.perf_counter()
    import gymnax
    import jax
    import jax.numpy as jnp
    from ppo import ActorCritic, make_train

    import_s = time.perf_counter() - t_import
    config = published_config(src / "ppo.py")
    config["DEBUG"] = False
    if args.total_timesteps:
        config["TOTAL_TIMESTEPS"] = args.total_timesteps
    published = dict(config)

    keys = jax.random.split(jax.random.PRNGKey(args.seed), args.k)
    train = jax.jit(jax.vmap(make_train(config)))
    t0 = time.perf_counter()
    compiled = train.lower(keys).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = compiled(keys)
    jax.block_until_ready(out)
    run_s = time.perf_counter() - t0
    params = out["runner_state"][0].params  # each leaf has the K axis in front

    env, env_params = gymnax.make(config["ENV_NAME"])
    network = ActorCritic(env.action_space(env_params).n, activation=config["ACTIVATION"])
    horizon = int(env_params.max_steps_in_episode)

    def episode_return(agent_params, key):
        reset_key, step_key = jax.random.split(key)
        obs, state = env.reset(reset_key, env_params)

        def step(carry, k):
            obs, state, total, alive = carry
            pi, _ = network.apply(agent_params, obs)
            obs, state, reward, done, _ = env.step(k, state, pi.mode(), env_params)
            total = total + reward * alive
            return (obs, state, total, alive * (1.0 - done)), None

        (_, _, total, _), _ = jax.lax.scan(step, (obs, state, 0.0, 1.0), jax.random.split(step_key, horizon))
        return total

    eval_keys = jax.random.split(jax.random.PRNGKey(10_000 + args.seed), args.k * EVAL_EPISODES).reshape(args.k, EVAL_EPISODES, -1)
    t0 = time.perf_counter()
    returns = jax.jit(jax.vmap(jax.vmap(episode_return, in_axes=(None, 0))))(params, eval_keys)
    finals = [float(x) for x in jnp.mean(returns, axis=1)]
    eval_s = time.perf_counter() - t0
    solved = sum(f >= SOLVED for f in finals)
    result = {
        "side": "purejaxrl", "k": args.k, "seed": args.seed, "config": published,
        "env_steps_per_seed": int(config["NUM_UPDATES"] * config["NUM_STEPS"] * config["NUM_ENVS"]),
        "import_s": round(import_s, 2), "compile_s": round(compile_s, 2), "run_s": round(run_s, 2),
        "eval_s": round(eval_s, 2), "final_returns": [round(f, 1) for f in finals], "solved": solved,
        "jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
        "affinity": sorted(os.sched_getaffinity(0)),
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "config"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
