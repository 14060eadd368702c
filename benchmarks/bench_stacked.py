"""The generic stacked form (`pipeline.nets.stacked`: vmap over functional_call) against the hand-written ensembles on
the same architecture: CPU per DQN and PPO update at K = 16 and 64, eager and through `compile_over_members`.

    python benchmarks/bench_stacked.py                    # K = 16, 64; 3 rounds (make bench runs it as --only stacked)
    python benchmarks/bench_stacked.py --k 16 --rounds 5 --no-compile

The architectures and batches are PureJaxRL's CartPole recipes (as benchmarks/bench_compile.py's): DQN a 120-84 ReLU
`MLP`, batch 128, MSE, fused Adam, no clipping; PPO a 64-64 tanh `ActorCritic`, minibatches of 128 rows of a
512-row rollout, per-agent gradient clipping 0.5, fused Adam. Each side builds its K members from the same seeds
(`seeded_members`): the hand-written side stacks them as `EnsembleMLP` / `EnsembleActorCritic`, the generic side as
`StackedModule` / `StackedActorCritic`. One update is the task's: the loss function (`td_loss`, `minibatch_losses`),
backward, clipping, the optimizer step, on synthetic data (only the update is timed). Variants alternate within a
round on one torch thread; per variant the median CPU microseconds per update; the ratios are generic / hand-written
of the same round, their median over rounds. DQN's eager row also shows the update task=dqn runs for our MLP by
default (its TD gradient written out, `nets/td_grad.py`). Compiling is timed apart (the first call's CPU minus a steady
one's, inductor's compiler processes counted).
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import statistics
import time

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # compile in this process: its CPU time is counted

import torch  # noqa: E402
from torch import nn  # noqa: E402

from pipeline.nets.actor_critic import ActorCritic  # noqa: E402
from pipeline.nets.ensemble import (  # noqa: E402
    EnsembleActorCritic,
    EnsembleMLP,
    clip_grad_norm_per_member_,
    compile_over_members,
    seeded_members,
    stacked_optimizer,
)
from pipeline.nets.mlp import MLP  # noqa: E402
from pipeline.nets.stacked import StackedActorCritic, StackedModule  # noqa: E402
from pipeline.rl.ppo import minibatch_indices  # noqa: E402
from pipeline.tasks.configs import PPOConfig  # noqa: E402
from pipeline.tasks.dqn import hand_td_grads, td_loss  # noqa: E402
from pipeline.tasks.ppo import minibatch_losses  # noqa: E402

OBS, ACTIONS = 4, 2  # CartPole
DQN_BATCH, PPO_ROLLOUT, PPO_MINIBATCHES = 128, 512, 4


def cpu_s() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


class Case:
    """One update of K members, ready to run: `step()`; `compiled` runs the loss function through compile_over_members."""

    def __init__(self, algo: str, k: int, side: str, compiled: bool):
        self.algo, self.k, self.side, self.compiled = algo, k, side, compiled
        gen = torch.Generator().manual_seed(0)
        seeds = range(1000, 1000 + k)
        adam = functools.partial(torch.optim.Adam, lr=2.5e-4, eps=1e-5)
        if algo == "dqn":
            members = seeded_members(functools.partial(MLP, hidden=(120, 84)), seeds, OBS, ACTIONS)
            self.net = EnsembleMLP(members) if side != "generic" else StackedModule(members)
            self.loss_fn = nn.MSELoss(reduction="none")
            self.data = (torch.randn(k, DQN_BATCH, OBS, generator=gen), torch.randint(0, ACTIONS, (k, DQN_BATCH), generator=gen),
                         torch.randn(k, DQN_BATCH, generator=gen))
            fn = td_loss
        else:
            members = seeded_members(functools.partial(ActorCritic, hidden=(64, 64), act="tanh"), seeds, OBS, ACTIONS)
            self.net = EnsembleActorCritic(members) if side != "generic" else StackedActorCritic(members)
            self.hp = PPOConfig()
            n = PPO_ROLLOUT
            self.rollout = (torch.randn(k, n, OBS, generator=gen), torch.randint(0, ACTIONS, (k, n), generator=gen),
                            -torch.rand(k, n, generator=gen), torch.randn(k, n, generator=gen), torch.randn(k, n, generator=gen),
                            torch.randn(k, n, generator=gen))
            self.generators = [torch.Generator().manual_seed(s) for s in seeds]
            self.order: list[torch.Tensor] = []
            fn = minibatch_losses
        self.params = list(self.net.parameters())
        self.opt = stacked_optimizer(adam, self.params)
        self.fn = compile_over_members(fn, "cpu") if compiled else fn

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        if self.algo == "dqn":
            if self.side == "hand-grad":  # the TD gradient written out: no autograd (MSE: beta 0)
                hand_td_grads(self.net, 0.0, *self.data)
            else:
                self.fn(self.net, self.loss_fn, *self.data)[0].sum().backward()
        else:
            if not self.order:
                self.order = list(minibatch_indices(self.generators, PPO_ROLLOUT, PPO_MINIBATCHES))
            idx = self.order.pop()
            self.fn(self.net, self.hp, False, idx, *self.rollout)[0].sum().backward()
            clip_grad_norm_per_member_(self.params, 0.5)
        self.opt.step()


def variants(compiled: bool, algo: str) -> list[tuple[str, bool]]:
    out = [("hand", False), ("generic", False)]
    if algo == "dqn":
        out.append(("hand-grad", False))
    if compiled:
        out += [("hand", True), ("generic", True)]
    return out


def measure(ks=(16, 64), rounds: int = 3, updates: int = 60, compiled: bool = True) -> dict:
    """CPU us per update of each variant, the generic / hand-written ratios, compile CPU; printed as a table."""
    torch.set_num_threads(1)
    cases, compile_s = {}, {}
    for algo in ("dqn", "ppo"):
        for k in ks:
            for side, comp in variants(compiled, algo):
                case = Case(algo, k, side, comp)
                c0 = cpu_s()
                case.step()  # warm-up; compiles a compiled variant
                first = cpu_s() - c0
                c0 = cpu_s()
                case.step()
                compile_s[(algo, k, side, comp)] = max(0.0, first - (cpu_s() - c0)) if comp else 0.0
                cases[(algo, k, side, comp)] = case
    per_update: dict[tuple, list[float]] = {key: [] for key in cases}
    for r in range(rounds):
        for key, case in cases.items():
            c0 = cpu_s()
            for _ in range(updates):
                case.step()
            per_update[key].append((cpu_s() - c0) / updates * 1e6)
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{a} K={k} {s}{' compiled' if c else ''} {per_update[(a, k, s, c)][-1]:.0f} us"
                                                   for a, k, s, c in cases), flush=True)

    def ratio(num: tuple, den: tuple) -> float:
        return statistics.median(a / b for a, b in zip(per_update[num], per_update[den]))

    rows = []
    for algo in ("dqn", "ppo"):
        for k in ks:
            row = {"algo": algo, "K": k, "hand_eager_us": statistics.median(per_update[(algo, k, "hand", False)]),
                   "generic_eager_us": statistics.median(per_update[(algo, k, "generic", False)]),
                   "ratio_eager": ratio((algo, k, "generic", False), (algo, k, "hand", False))}
            if algo == "dqn":
                row["hand_grad_us"] = statistics.median(per_update[(algo, k, "hand-grad", False)])
                row["ratio_eager_vs_hand_grad"] = ratio((algo, k, "generic", False), (algo, k, "hand-grad", False))
            if compiled:
                row.update(hand_compiled_us=statistics.median(per_update[(algo, k, "hand", True)]),
                           generic_compiled_us=statistics.median(per_update[(algo, k, "generic", True)]),
                           ratio_compiled=ratio((algo, k, "generic", True), (algo, k, "hand", True)),
                           compile_cpu_s_hand=compile_s[(algo, k, "hand", True)], compile_cpu_s_generic=compile_s[(algo, k, "generic", True)])
            rows.append(row)
    print(f"\nGeneric stacked form / hand-written ensemble, CPU us per update (one thread, median of {rounds} rounds of "
          f"{updates}; targets: eager <= 1.5x, compiled <= 1.15x)")
    print("| update | K | hand eager | generic eager | ratio eager | hand compiled | generic compiled | ratio compiled | compile CPU s (hand / generic) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        eager = f"**{row['ratio_eager']:.2f}x**"
        if "hand_grad_us" in row:
            eager += f" ({row['ratio_eager_vs_hand_grad']:.2f}x task=dqn's hand gradient, {row['hand_grad_us']:.0f} us)"
        comp = (f"{row['hand_compiled_us']:.0f} | {row['generic_compiled_us']:.0f} | **{row['ratio_compiled']:.2f}x** | "
                f"{row['compile_cpu_s_hand']:.0f} / {row['compile_cpu_s_generic']:.0f}") if compiled else "- | - | - | -"
        print(f"| {row['algo']} | {row['K']} | {row['hand_eager_us']:.0f} | {row['generic_eager_us']:.0f} | {eager} | {comp} |")
    return {"rows": rows, "rounds": rounds, "updates": updates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=60, help="updates per variant per round")
    parser.add_argument("--no-compile", action="store_true", help="eager variants only")
    args = parser.parse_args()
    measure(tuple(args.k), args.rounds, args.updates, not args.no_compile)


if __name__ == "__main__":
    main()
