"""PureJaxRL's DQN on CartPole-v1, K seeds at once, timed and evaluated: the DQN side of `make bench-jax`.

Like `purejaxrl_ppo.py`: run in the benchmark's own virtualenv against a scratch copy of PureJaxRL; its
`dqn.py` (a port of CleanRL's `dqn_jax.py`) is imported, not rewritten, and its published CartPole settings
are read from its own `main()` (10 envs, buffer 10,000, batch 128, 500k env steps, epsilon 1 -> 0.05 over
250k, a hard target copy every 500 env steps, Adam 2.5e-4, learning from 10,000 env steps, one update of
128 samples per 10 env steps, MSE loss, 120-84 ReLU net, gamma 0.99). Two shims let the 2024 file run on the
pinned JAX: `jax.tree_map` (removed from JAX) points at `jax.tree_util.tree_map`, and a stand-in `wandb`
module is used if wandb is not installed (dqn.py imports it at module level; only its `main()` uses it).

    python benchmarks/purejaxrl_dqn.py --purejaxrl <dir> --k 16 --total-timesteps 50000 --out result.json

Each trained agent then plays 10 fresh episodes greedily (argmax of its Q-values); solved: mean >= 475.
"""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

from purejaxrl_ppo import arguments, greedy_finals, published_config, timed_train, write_result


def main(argv=None) -> int:
    args = arguments(__doc__, argv, "dqn.py")
    t_import = time.perf_counter()
    import gymnax
    import jax
    import jax.numpy as jnp

    if not hasattr(jax, "tree_map"):
        jax.tree_map = jax.tree_util.tree_map
    try:
        import wandb  # noqa: F401
    except ImportError:
        sys.modules["wandb"] = types.ModuleType("wandb")
    from dqn import QNetwork, make_train

    import_s = time.perf_counter() - t_import
    config = published_config(Path(args.purejaxrl) / "dqn.py")
    config["WANDB_MODE"] = "disabled"
    if args.total_timesteps:
        config["TOTAL_TIMESTEPS"] = args.total_timesteps
    published = dict(config)
    out, timing = timed_train(make_train(config), jax.random.split(jax.random.PRNGKey(args.seed), args.k))
    # One vector step of NUM_ENVS envs per scan step; an update (one batch) on every step after LEARNING_STARTS.
    vector_steps = int(config["NUM_UPDATES"])
    updates = [int(u) for u in out["runner_state"][0].n_updates]
    finals = eval_s = None
    if not args.no_eval:
        env, env_params = gymnax.make(config["ENV_NAME"])
        network = QNetwork(action_dim=env.action_space(env_params).n)
        finals, eval_s = greedy_finals(env, env_params, lambda p, obs: jnp.argmax(network.apply(p, obs), axis=-1),
                                       out["runner_state"][0].params, args.k, args.seed)
    write_result(args, "purejaxrl-dqn", published, import_s, timing, vector_steps * int(config["NUM_ENVS"]),
                 max(updates) * int(config["BUFFER_BATCH_SIZE"]), finals, eval_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
