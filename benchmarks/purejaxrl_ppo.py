"""PureJaxRL's PPO on CartPole-v1, K seeds at once, timed and evaluated: the JAX side of `make bench-jax`.

Runs in the benchmark's own virtualenv (jax, flax, optax, gymnax, distrax: never the pipeline's), against a
scratch copy of PureJaxRL (`--purejaxrl <dir>`, the folder holding `ppo.py` and `wrappers.py`; fetched by
`benchmarks/bench_jax.py`, never vendored). Nothing of PureJaxRL is rewritten here: its `make_train` and
`ActorCritic` are imported, and its published defaults are read from its own `ppo.py` (the `config` dict of
its `__main__` block), with DEBUG off (a per-step print) and the seed count ours.

    python benchmarks/purejaxrl_ppo.py --purejaxrl <dir> --k 16 --seed 0 --out result.json
    python benchmarks/purejaxrl_ppo.py --purejaxrl <dir> --k 64 --total-timesteps 65536 --no-eval --out r.json

What it does, as PureJaxRL's README does: `jax.jit(jax.vmap(make_train(config)))` over K PRNG keys. The
compile is timed on its own (`.lower(keys).compile()`, wall and CPU seconds), then the compiled call (blocked
until done). Each trained agent then plays 10 fresh episodes greedily (the mode of its categorical policy;
gymnax's CartPole-v1 ends at 500 steps): a seed is solved when that mean reaches 475, the pipeline's own test.
The record also holds the learning work: env steps and backpropagated samples (epochs x env steps per update).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

EVAL_EPISODES = 10
SOLVED = 475.0


def published_config(source: Path) -> dict:
    """The `config = {...}` literal of the file's `__main__` block or `main()`: PureJaxRL's own defaults."""
    tree = ast.parse(source.read_text())
    for node in ast.walk(tree):
        main_block = isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
        if main_block or (isinstance(node, ast.FunctionDef) and node.name == "main"):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "config" for t in stmt.targets):
                    return ast.literal_eval(stmt.value)
    raise SystemExit(f"error: no `config = {{...}}` in {source}'s __main__ block or main(): is this PureJaxRL's file?")


def arguments(doc: str, argv, script: str):
    """The options both PureJaxRL sides take; `script` is the file PureJaxRL's folder must hold."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--purejaxrl", required=True, help=f"folder with PureJaxRL's {script}")
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-timesteps", type=float, default=None, help="default: PureJaxRL's own")
    parser.add_argument("--no-eval", action="store_true", help="skip the greedy evaluation (throughput runs)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not (Path(args.purejaxrl) / script).is_file():
        raise SystemExit(f"error: {args.purejaxrl}/{script} not found: pass PureJaxRL's purejaxrl/ folder as --purejaxrl")
    sys.path.insert(0, str(args.purejaxrl))
    return args


def timed_train(train_fn: Callable, keys) -> tuple[object, dict]:
    """`jit(vmap(train_fn))` over `keys`: compile and run timed apart, in wall and CPU seconds."""
    import jax

    train = jax.jit(jax.vmap(train_fn))
    t0, c0 = time.perf_counter(), time.process_time()
    compiled = train.lower(keys).compile()
    t1, c1 = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(compiled(keys))
    t2, c2 = time.perf_counter(), time.process_time()
    return out, {"compile_s": round(t1 - t0, 2), "compile_cpu_s": round(c1 - c0, 2),
                 "run_s": round(t2 - t1, 2), "run_cpu_s": round(c2 - c1, 2)}


def greedy_finals(env, env_params, act: Callable, params, k: int, seed: int) -> tuple[list[float], float]:
    """Each of the K agents (`params` leaves with the K axis in front) plays EVAL_EPISODES fresh episodes with
    `act(agent_params, obs) -> action`; their mean returns and the evaluation's wall seconds."""
    import jax
    import jax.numpy as jnp

    horizon = int(env_params.max_steps_in_episode)

    def episode_return(agent_params, key):
        reset_key, step_key = jax.random.split(key)
        obs, state = env.reset(reset_key, env_params)

        def step(carry, key):
            obs, state, total, alive = carry
            obs, state, reward, done, _ = env.step(key, state, act(agent_params, obs), env_params)
            return (obs, state, total + reward * alive, alive * (1.0 - done)), None

        (_, _, total, _), _ = jax.lax.scan(step, (obs, state, 0.0, 1.0), jax.random.split(step_key, horizon))
        return total

    keys = jax.random.split(jax.random.PRNGKey(10_000 + seed), k * EVAL_EPISODES).reshape(k, EVAL_EPISODES, -1)
    t0 = time.perf_counter()
    returns = jax.jit(jax.vmap(jax.vmap(episode_return, in_axes=(None, 0))))(params, keys)
    return [round(float(x), 1) for x in jnp.mean(returns, axis=1)], round(time.perf_counter() - t0, 2)


def write_result(args, side: str, config: dict, import_s: float, timing: dict, env_steps: int, samples: int,
                 finals: list[float] | None, eval_s: float | None) -> None:
    import jax

    result = {
        "side": side, "k": args.k, "seed": args.seed, "config": config, "env_steps_per_seed": env_steps,
        "backprop_samples_per_seed": samples, "import_s": round(import_s, 2), **timing, "eval_s": eval_s,
        "final_returns": finals, "solved": None if finals is None else sum(f >= SOLVED for f in finals),
        "jax": jax.__version__, "devices": [str(d) for d in jax.devices()], "affinity": sorted(os.sched_getaffinity(0)),
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "config"}))


def main(argv=None) -> int:
    args = arguments(__doc__, argv, "ppo.py")
    t_import = time.perf_counter()
    import gymnax
    import jax
    from ppo import ActorCritic, make_train

    import_s = time.perf_counter() - t_import
    config = published_config(Path(args.purejaxrl) / "ppo.py")
    config["DEBUG"] = False
    if args.total_timesteps:
        config["TOTAL_TIMESTEPS"] = args.total_timesteps
    published = dict(config)
    out, timing = timed_train(make_train(config), jax.random.split(jax.random.PRNGKey(args.seed), args.k))
    env_steps = int(config["NUM_UPDATES"] * config["NUM_STEPS"] * config["NUM_ENVS"])
    finals = eval_s = None
    if not args.no_eval:
        env, env_params = gymnax.make(config["ENV_NAME"])
        network = ActorCritic(env.action_space(env_params).n, activation=config["ACTIVATION"])
        finals, eval_s = greedy_finals(env, env_params, lambda p, obs: network.apply(p, obs)[0].mode(),
                                       out["runner_state"][0].params, args.k, args.seed)
    write_result(args, "purejaxrl", published, import_s, timing, env_steps, env_steps * config["UPDATE_EPOCHS"], finals, eval_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
