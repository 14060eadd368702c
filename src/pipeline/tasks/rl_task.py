"""RLTask: the middle layer of every RL task (DQN, PPO, SAC, TD3, CEM), between the lifecycle's `Task` and one algorithm.

The shape is Stable-Baselines3's `OnPolicyAlgorithm` / `OffPolicyAlgorithm` between `BaseAlgorithm` and `PPO`: this
class owns everything an RL run does around its algorithm, for K agents at once (`seeds_per_process=K`; agent i is
seed `seed + i` and trains like the single run of that seed, in distribution):

- the batch: `slots` (the agents still learning, in member order of `net`), one generator per learning agent
  (`generators`, seeded with its seed), one vector env with `envs_per_agent` rows per learning agent (`env`; rows
  `s * E ... s * E + E - 1` are slot s's), the current observations `obs` and running episode returns;
- the schedule of one Lightning step: `iterate()` (the algorithm), then a log row every `log_every` env steps, an
  evaluation every `eval_every`, the checkpoint hook; the fit ends when `iterations_left()` is 0 or no agent learns;
- evaluation: deterministic play (`evaluation_policy`) on envs seeded apart from training, and the stop rule
  (below); an agent that stops leaves the batch: its weights go to `agents_net` (what the record holds) and every
  per-agent structure shrinks (the net's members, Adam's moments, envs, generators, and through `keep_agents_` the
  algorithm's own), so later iterations cost what the remaining agents cost;
- logging (one metrics.csv per agent; TensorBoard / W&B), the tuner's pruning, the progress bar, training videos;
- `fit_and_evaluate` (a final evaluation of every agent on fresh episodes), agent records and model files;
- checkpoints: a declared skeleton (`checkpoint_state` / `load_checkpoint_state`): the progress counters, declared
  once as a dataclass (`RLProgress`, extended by the algorithm's own: `RunProgress`), the networks, the optimizer,
  every RNG, the envs mid-episode, and the algorithm's extra state (`algorithm_state`).

**The stop rule** (`task.stop_at_return`, the same for every algorithm). An agent leaves the batch only when its
evaluation shows the bar on episodes it was not selected on: a screening evaluation (`eval_episodes` episodes on the
evaluation seeds) whose mean reaches `stop_at_return` is followed by a confirmation evaluation of
`stop_confirm_episodes` fresh episodes (start states never used before by this agent's evaluations), and the agent
stops only if that mean reaches the bar too. The confirmation is an unbiased sample of the policy's return:
for an agent whose true mean return is mu below the bar S with per-episode spread sigma, it passes with
probability about Phi(-(S - mu) sqrt(n) / sigma); where S is the most an episode can score (CartPole's 500), every
one of the n episodes must reach it, and an agent that does so on a fraction p of its episodes passes with p^n
(n = 30, p = 0.9: 4%). `stop_confirm_episodes=0` lets the screening alone decide. docs/rl.md says what it costs.

**Best weights** (`task.keep_best`): each screening evaluation that beats the agent's earlier ones writes its weights
to `best.pt` in the agent's record dir at once (atomically); the checkpoint keeps which evaluation that was, so a
resumed run replaces best.pt only with a better one, and the record's `best` names it.

**An algorithm** subclasses RLTask, sets `Config` (extending `pipeline.tasks.configs.RLConfig`), `algorithm`,
`checkpoint_format`, `policy` (how its network acts: `pipeline.rl.policies`), and defines the hooks below;
docs/add_an_algorithm.md walks through one. One that plays whole
episodes on envs of its own (CEM) sets `vector_env = False` and its Config extends `RLBatchConfig`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from pipeline.nets.ensemble import keep_optimizer_members_, stacked_optimizer
from pipeline.rl.envs import make_env, run_threshold
from pipeline.rl.policies import Policy, member_files
from pipeline.rl.targets import freeze
from pipeline.rl.tensor_env import TensorStep
from pipeline.rl.vector import evaluate_agents, make_vector_env
from pipeline.store.checkpoint import rng_state, save_atomic, set_rng_state
from pipeline.store.layout import BEST, agent_dirs, best_path
from pipeline.tasks.base import Progress, Task, TaskParts

# Evaluation envs are seeded away from the training envs' streams: agent i's episode j of an evaluation starts
# from seed `seed + i + offset + j`.
EVAL_SEED_OFFSET = 10_000
FINAL_EVAL_SEED_OFFSET = 20_000
# The stop rule's confirmations: the k-th evaluation's confirmation plays from CONFIRM_SEED_OFFSET + k * n on.
CONFIRM_SEED_OFFSET = 30_000
FP32 = ("32-true", "32")


def spaces_of(env: str | dict, kwargs: dict | None = None) -> tuple[gym.spaces.Space, gym.spaces.Space]:
    """The observation and action spaces of `env` (an id or the env group), from one throwaway env."""
    probe = make_env(env, **(kwargs or {}))
    spaces = probe.observation_space, probe.action_space
    probe.close()
    return spaces


def per_agent(start: Callable[[], Any]) -> Any:
    """A progress field holding one value per agent (all K, stopped or not), each `start()` when a run begins."""
    return field(default_factory=list, metadata={"per_agent": start})


@dataclass
class RLProgress:
    """What every RL run counts as it trains, declared once: the task starts from `start(K)` (each field becomes an
    attribute of the task), `checkpoint_state` saves these attributes and `load_checkpoint_state` sets them back.
    An algorithm extends it with its own counters (a dataclass subclass, set as the task's `RunProgress`)."""

    env_steps: int = 0  # per agent: the learning agents step in lockstep
    last_log_step: int = 0
    episode_returns: list[list[float]] = per_agent(list)
    evaluations: list[list[tuple[int, float, float]]] = per_agent(list)  # (env_step, mean, std) of each screening
    confirmations: list[list[tuple[int, float]]] = per_agent(list)  # (env_step, mean) of each confirmation played
    time_to_threshold_s: list[float | None] = per_agent(lambda: None)
    early_stop: list[dict | None] = per_agent(lambda: None)
    stop_step: list[int | None] = per_agent(lambda: None)
    stop_time_s: list[float | None] = per_agent(lambda: None)

    @classmethod
    def start(cls, n_agents: int) -> RLProgress:
        return cls(**{f.name: [f.metadata["per_agent"]() for _ in range(n_agents)]
                      for f in fields(cls) if "per_agent" in f.metadata})


class RLTask(Task):
    """The K-agent RL run around one algorithm. Subclasses define the hooks in the "algorithm" section."""

    writes_curves = True  # one CurveLog per agent (its metrics.csv)
    checkpointing = "state"
    primary_metric = "eval/return_mean"
    primary_curve = "eval/return_mean"
    #: The task's name in messages (`task=<algorithm>`).
    algorithm: ClassVar[str] = "rl"
    #: The format tag of its checkpoints (bump it when what they hold changes).
    checkpoint_format: ClassVar[str] = "pipeline.rl/1"
    #: The progress counters (RLProgress or a subclass of it).
    RunProgress: ClassVar[type[RLProgress]] = RLProgress
    #: The networks a checkpoint holds as state_dicts (all of them must be ensembles of the learning agents, except
    #: `agents_net`); with every agent stopped only `agents_net` is loaded back.
    checkpointed_nets: ClassVar[tuple[str, ...]] = ("net", "agents_net")
    #: How the evaluation policy plays, in stop reasons ("greedy", "deterministic").
    evaluation_kind: ClassVar[str] = "deterministic"
    #: How the algorithm's plain network (and its `agent_files`) acts: a `pipeline.rl.policies.Policy` class. Training
    #: evaluations, videos, `python -m pipeline.eval`, `pipeline.load(...).act` and `python -m pipeline.export` all
    #: play it; the record names it (`policy`), so a replay finds it without importing the task.
    policy: ClassVar[type[Policy] | None] = None
    #: True: RLTask runs one vector env of `envs_per_agent` rows per learning agent (`env`, `obs`, running returns),
    #: checkpoints it and shrinks it. False: the algorithm plays on envs of its own, as a whole-episode algorithm must
    #: (CEM: the vector env restarts a finished row at once and cannot pause it); its Config then extends
    #: `RLBatchConfig` (no total_steps / envs_per_agent), and it defines `budget()` and, for a per-agent step count,
    #: `agent_env_steps(i)`.
    vector_env: ClassVar[bool] = True

    def __init__(self, config: Any, parts: TaskParts):
        super().__init__(config, parts)
        hp = self.config
        env = parts.require("env", self.algorithm, "choose an environment with env=cartpole|pendulum|...")
        self.optimizer_factory = parts.require("optimizer", self.algorithm, "choose one with optimizer=adam|sgd|...")
        self.automatic_optimization = False
        self.env_cfg = dict(env)
        self.env_id = str(env["id"])
        self.observation_space, self.action_space = spaces_of(self.env_cfg)
        self.obs_shape = tuple(self.observation_space.shape)
        self.envs_per_agent = int(hp.envs_per_agent) if self.vector_env else 0
        self.threshold = run_threshold(self.env_cfg, hp.threshold)
        self.capture_video = bool(hp.capture_video)
        self.return_bounds: tuple[float, float] | None = None
        self.slots = list(range(self.n_agents))
        for name, value in vars(self.RunProgress.start(self.n_agents)).items():
            setattr(self, name, value)
        self.final_metrics: list[dict[str, float]] = []
        self._elapsed_before = 0.0  # training seconds of earlier segments (a resumed run)
        self._t_train_start: float | None = None
        self._train_seconds = 0.0
        self._resume: dict | None = None
        self._finished: list[tuple[torch.Tensor, torch.Tensor]] = []  # episodes ended, not yet credited (`note_finished`)
        # task.keep_best: which evaluation each agent's best.pt holds ({"file", "env_step", "return_mean"}), and where
        # the agents' records live (their best.pt is written there as it improves; none for a task built by hand).
        self.best: list[dict | None] = [None] * self.n_agents
        self.record_dirs = agent_dirs(parts.run_dir, self.agent_seeds) if parts.run_dir is not None else []
        # `net` trains the agents still learning (member m is agent slots[m]); `agents_net` holds every agent's
        # weights for the record, each written when the agent stops or the run ends.
        self.net = self.build_net(parts)
        if not (isinstance(self.policy, type) and issubclass(self.policy, Policy)):
            raise TypeError(f"{type(self).__name__} must declare policy = <a pipeline.rl.policies.Policy class>: how its network acts")
        self.agents_net = freeze(copy.deepcopy(self.net))

    # ---- the algorithm: the hooks a subclass defines -------------------------------------------------
    def build_net(self, parts: TaskParts) -> nn.Module:
        """Return the learning network: an ensemble of K members (`pipeline.nets.ensemble.make_ensemble` over
        `self.agent_seeds`), member i initialised as the single run of seed `seed + i`. Called once from `__init__`,
        after the spaces (`observation_space`, `action_space`, `obs_shape`) are known; refuse settings the env
        cannot run with here, in one line. `self.optimizer_factory` is later called with its parameters."""
        raise TypeError(f"{type(self).__name__} must define build_net")

    def iterations_left(self) -> int:
        """How many iterations (Lightning steps) the budget still allows; 0 ends the fit. Must follow from the progress
        counters alone (a resumed run asks it before fitting)."""
        raise TypeError(f"{type(self).__name__} must define iterations_left")

    def iterate(self) -> None:
        """One iteration of the algorithm for the learning agents: act in `self.env` through `step_envs` (rows of slot
        s: s * E ...; it moves `self.obs` and `self.env_steps` on and keeps the episodes' returns), then learn. Every random draw of an agent comes from `self.generators[slot]`, or the
        global generator (which checkpoints restore). Runs between checkpoints: whatever it starts, it finishes."""
        raise TypeError(f"{type(self).__name__} must define iterate")

    def evaluation_policy(self, net: nn.Module, agents: torch.Tensor | None) -> Policy:
        """The declared `policy` over `net`'s members, for `pipeline.rl.vector.evaluate_agents`: observations
        [members, n, *obs_shape] -> deterministic actions [members, n, ...], each member with its agent's files
        (`agent_files`; `agents`: which of the K agents member m plays for, None: all K in order) and the task's
        settings. The same declaration a replay, `pipeline.load`, an export and a video build from model.pt."""
        members = range(self.n_agents) if agents is None else agents.tolist()
        return self.policy(net, self.action_space, member_files([self.agent_files(a) for a in members]), asdict(self.config))

    def iteration_screening(self) -> dict[int, float]:
        """Whole-episode algorithms: the mean return of the episodes the last iteration played, per learning slot, which
        the stop rule screens like an evaluation (CEM: each agent's batch); a slot reaching stop_at_return is then
        confirmed on fresh episodes. Default: {} (only evaluations are screened)."""
        return {}

    def confirmation_round(self) -> int:
        """Which screening this is, so each confirmation plays start states no earlier one used (its seeds start at
        CONFIRM_SEED_OFFSET + stop_confirm_episodes * round). Default: the evaluation's index, env_steps // eval_every."""
        return self.env_steps // self.config.eval_every

    def budget(self) -> tuple[int, int, str]:
        """What the progress bar counts: (done, total, unit). Default: env steps per agent of task.total_steps."""
        return self.env_steps, self.config.total_steps, "env steps"

    def close_envs(self) -> None:
        """After the final evaluation: close the envs the run trained on (an algorithm with envs of its own closes them)."""
        if hasattr(self, "env"):
            self.env.close()

    def keep_agents_(self, keep: torch.Tensor, keep_slots: list[int], training: bool) -> None:
        """Shrink the algorithm's own per-learning-agent state to the slots `keep_slots` (`keep` as a tensor, in that
        order: the new slot j was slot keep_slots[j]): target nets, replay buffers, statistics, recent losses.
        `net`, its optimizer, envs, observations and generators are shrunk here already. `training`: the fit's
        objects exist (False when a checkpoint is loaded before the fit: only what __init__ built). Default: none."""

    def train_metrics(self, slot: int, agent: int) -> dict[str, float]:
        """The algorithm's rows of a log row for the learning agent at `slot` (train/loss, ...), and a chance to
        reset what it averaged since the last row. Default: none."""
        return {}

    def algorithm_state(self) -> dict:
        """The algorithm's state that a checkpoint needs besides the skeleton's (`checkpointed_nets`, the optimizer,
        progress, generators, envs, RNGs), as plain values (weights_only loads): statistics, a scheduler, a replay
        buffer (under the key "replay", which the run's record notes). Its keys sit beside the skeleton's in the
        checkpoint and must not reuse them (refused). Default: none."""
        return {}

    def load_algorithm_state(self, state: dict) -> None:
        """Before the fit: take what `algorithm_state` saved (`state` is the whole checkpoint; the batch has already
        shrunk to the checkpoint's slots). Whatever needs the fit's objects (an optimizer's scheduler, a replay buffer) waits for
        `resume_algorithm_state`. Default: nothing."""

    def resume_algorithm_state(self, state: dict) -> None:
        """At train start of a resumed run, after the optimizer, generators and envs are restored: the rest of
        `algorithm_state`. Default: nothing."""

    def final_agent_metrics(self, i: int) -> dict[str, float]:
        """Extra final metrics of agent i (e.g. train/updates), beside eval/return_* and train/episodes."""
        return {}

    def algorithm_record(self, i: int) -> dict:
        """Extra fields of agent i's result.json beside the RL ones (`rl_record`). Default: none."""
        return {}

    # ---- Lightning plumbing ----------------------------------------------------------------------------
    def configure_optimizers(self):
        return stacked_optimizer(self.optimizer_factory, self.net.parameters())

    def train_dataloader(self) -> DataLoader:
        # Each item is one iteration; the data itself comes from the environment.
        return DataLoader(range(max(1, self.iterations_left())), batch_size=None, shuffle=False)

    def on_fit_start(self) -> None:
        """The learning agents' generators and (`vector_env`) envs, observations and episode returns (a subclass adds
        its own after `super().on_fit_start()`)."""
        seeds, E = [self.agent_seeds[a] for a in self.slots], self.envs_per_agent
        self.generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        if not self.vector_env:
            return
        self.env = make_vector_env(self.env_cfg, seeds, E, device=self.device)
        self.return_bounds = getattr(self.env, "return_bounds", None)
        self.obs = self.env.reset()
        self.episode_return = torch.zeros(len(seeds) * E, device=self.device, dtype=torch.float64)

    def on_train_start(self) -> None:
        if self._resume is not None:
            self._restore_training_state(self._resume)
            self._resume = None
        self._t_train_start = time.perf_counter()

    def training_step(self, batch, batch_idx):
        hp = self.config
        if self.iterations_left() <= 0 or not self.slots:
            self.trainer.should_stop = True
            return None
        before = self.env_steps
        self.iterate()
        self.credit_finished()
        if self.env_steps - self.last_log_step >= hp.log_every:
            self.log_progress()
        if screened := self.iteration_screening():
            self.screen_iteration(screened)
        if hp.eval_every and self.slots and self.env_steps // hp.eval_every != before // hp.eval_every:
            self.evaluate_now()
        if not self.slots:
            self.trainer.should_stop = True
        self.safe_point()  # saves when due, and stops the fit when a stop was requested
        return None

    def on_train_end(self) -> None:
        self._train_seconds = self.elapsed_s()
        if self.slots and self.env_steps != self.last_log_step:
            self.log_progress()
        self.sync_agents_net()
        self.safe_point(final=True)

    # ---- the batch ---------------------------------------------------------------------------------
    def step_envs(self, actions: torch.Tensor, acting_since: float | None = None) -> TensorStep:
        """One step of every learning agent's envs (`self.env`) with `actions` [slots * E, ...] (what the env is sent; row
        r is slot r // E's), and what every acting loop does with it: the observations (`obs`) and the env-step count
        (`env_steps`, per agent: E more) move on, the running episode returns take the rewards, and each episode that
        ends is queued for its agent's `episode_returns` (`note_finished`; credited after the iteration, or by
        `credit_finished`). The env's step and this are booked as "env" time and, given `acting_since` (the
        `time.perf_counter()` at which choosing these actions began), the choice as "act". Returns the env's step:
        reward, terminated, truncated, done, final_obs (where each action led), obs (what the agents see next)."""
        t0 = time.perf_counter()
        step = self.env.step(actions)
        self.note_finished(step.done, self.add_rewards(step.reward, step.done))
        self.obs = step.obs
        self.env_steps += self.envs_per_agent
        if acting_since is not None:
            self.add_time("act", t0 - acting_since)
        self.add_time("env", time.perf_counter() - t0)
        return step

    def note_finished(self, done: torch.Tensor, returns: torch.Tensor) -> None:
        """The episodes a step ended (`done` and the returns as they stood after it, [slots * E]; or S steps' [S, slots * E])
        queued for `credit_finished`, in step order: a loop that steps the env itself (PPO's tensor rollout) calls it."""
        self._finished.append((done.reshape(-1, done.shape[-1]), returns.reshape(-1, returns.shape[-1])))

    def credit_finished(self) -> None:
        """Each queued episode's return to the agent whose env ran it (`credit_episodes`), in step order: one host sync
        for all the steps since the last call, not one a step."""
        if self._finished:
            done, returns = (torch.cat(x) for x in zip(*self._finished))
            self._finished = []
            self.credit_episodes(done, returns)

    def agent_view(self, x: torch.Tensor) -> torch.Tensor:
        """[slots * E, ...] rows of the vector env -> [slots, E, ...]."""
        return x.view(len(self.slots), -1, *x.shape[1:])

    def slot_index(self) -> torch.Tensor | None:
        """The learning agents' indices among all K (for per-agent state kept for all K); None while all of them learn."""
        if len(self.slots) == self.n_agents:
            return None
        return torch.tensor(self.slots, device=self.device)

    def add_rewards(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """A step's rewards [slots * E] into the running episode returns; returns those returns as they stand after the
        step (what a finished episode scored), then restarts the finished ones."""
        returns = self.episode_return + reward
        self.episode_return = returns.masked_fill(done, 0.0)
        return returns

    def credit_episodes(self, ended: torch.Tensor, returns: torch.Tensor) -> None:
        """Each finished episode's return to the agent whose env ran it: ended/returns [T, slots * E] (row r is slot
        r // E), in step order."""
        E = self.envs_per_agent
        for t, row in ended.nonzero().tolist():
            self.episode_returns[self.slots[row // E]].append(float(returns[t, row]))

    def learning_agents(self) -> list[int]:
        """The agents still training."""
        return list(self.slots)

    def sync_agents_net(self) -> None:
        """The learning agents' current weights into `agents_net` (the stopped ones are there already)."""
        for slot, agent in enumerate(self.slots):
            self.agents_net.load_member_state_dict(agent, self.net.member_state_dict(slot))

    def stop_agents(self, reasons: dict[int, str]) -> None:
        """The agents at the slots `reasons` names stop learning: their weights go to the record and they leave the batch."""
        elapsed = self.elapsed_s()
        for slot, reason in reasons.items():
            agent = self.slots[slot]
            self.agents_net.load_member_state_dict(agent, self.net.member_state_dict(slot))
            step = self.agent_env_steps(agent)
            self.stop_step[agent], self.stop_time_s[agent] = step, elapsed
            self.early_stop[agent] = {"env_step": step, "reason": reason}
        keep = [s for s in range(len(self.slots)) if s not in reasons]
        if keep:
            self.keep_slots_(keep)
        else:
            self.slots = []

    def keep_slots_(self, keep_slots: list[int], training: bool = True) -> None:
        """Shrink the batch to `keep_slots` (the others' weights, Adam moments, envs, generators and, through
        `keep_agents_`, the algorithm's own state go); `training`: the fit's objects exist and shrink too."""
        self.credit_finished()  # queued episodes go to the agents of the rows as they are
        keep = torch.tensor(keep_slots, device=self.device)
        E = self.envs_per_agent
        n_before = len(self.slots)
        pairs = self.net.keep_members_(keep)
        if training:
            keep_optimizer_members_(self.optimizers().optimizer, pairs, keep, n_before)
            self.generators = [self.generators[s] for s in keep_slots]
        if training and self.vector_env:
            keep_envs = (keep.view(-1, 1) * E + torch.arange(E, device=self.device)).view(-1)
            self.env.keep_envs_(keep_envs)
            self.obs = self.obs.index_select(0, keep_envs)
            self.episode_return = self.episode_return.index_select(0, keep_envs)
        self.slots = [self.slots[s] for s in keep_slots]
        self.keep_agents_(keep, keep_slots, training)

    def agent_env_steps(self, i: int) -> int:
        return self.stop_step[i] if self.stop_step[i] is not None else self.env_steps

    def total_env_steps(self) -> int:
        """Env steps over all agents: each stopped agent counts until its stop."""
        return sum(self.agent_env_steps(i) for i in range(self.n_agents))

    def elapsed_s(self) -> float:
        """Training seconds so far, over every segment of the run."""
        running = time.perf_counter() - self._t_train_start if self._t_train_start is not None else 0.0
        return self._elapsed_before + running

    # ---- evaluation and the stop rule ---------------------------------------------------------------
    def evaluation_returns(self, n_episodes: int, seed_offset: int, slots: Sequence[int] | None = None) -> np.ndarray:
        """[agents, n_episodes] returns of the evaluation policy: of every agent (`slots` None, [K, n]: the learning
        ones as they are now, the stopped ones as they stopped), or of the learning agents at `slots`, in that order."""
        if slots is None:
            self.sync_agents_net()
            net, agents, index = self.agents_net, list(range(self.n_agents)), None
        else:
            slots = list(slots)
            agents = [self.slots[s] for s in slots]
            if slots == list(range(len(self.slots))):
                net, index = self.net, self.slot_index()
            else:  # a copy holding only those members
                net = copy.deepcopy(self.net)
                net.keep_members_(torch.tensor(slots, device=self.device))
                index = torch.tensor(agents, device=self.device)
        returns = evaluate_agents(self.evaluation_policy(net, index), self.env_cfg, [self.agent_seeds[a] for a in agents],
                                  n_episodes, seed_offset, device=self.device)
        return returns.double().cpu().numpy()

    def evaluate_now(self) -> None:
        """Every learning agent's screening evaluation, its curve row, videos, the stop rule and the tuner's pruning."""
        hp = self.config
        t0 = time.perf_counter()
        returns = self.evaluation_returns(hp.eval_episodes, EVAL_SEED_OFFSET, range(len(self.slots)))
        self.add_time("eval", time.perf_counter() - t0)
        elapsed = self.elapsed_s()
        passed, bar = {}, hp.stop_at_return
        for slot, agent in enumerate(self.slots):
            mean = float(returns[slot].mean())
            self.note_evaluation(agent, mean, float(returns[slot].std()), elapsed)
            self.keep_if_best(slot, agent, mean)
            if bar is not None and mean >= bar:
                passed[slot] = f"{self.evaluation_kind} evaluation mean {mean:.1f} >= stop_at_return {bar}"
        if self.n_agents > 1:
            self._log_shared({"batch/eval_return_mean": float(returns.mean()), "batch/agents_learning": float(len(self.slots))})
        self.record_training_videos()
        reasons = self.confirmed_stops(passed)
        # A pruned trial stops every agent still learning, and their records say so (the tuner and the report count them).
        if self.pruned_by_tuner():
            reasons = dict.fromkeys(range(len(self.slots)), "pruned by the tuner")
        if reasons:
            self.stop_agents(reasons)

    def screen_iteration(self, means: dict[int, float]) -> None:
        """The stop rule on an iteration's own episodes (`iteration_screening`): the threshold's first crossing, then
        the slots whose batch mean reached stop_at_return and whose confirmation agrees stop."""
        elapsed, bar = self.elapsed_s(), self.config.stop_at_return
        for slot, mean in means.items():
            self.note_threshold(self.slots[slot], mean, elapsed)
        if bar is None:
            return
        passed = {slot: f"batch mean return {mean:.1f} >= stop_at_return {bar}" for slot, mean in means.items() if mean >= bar}
        if reasons := self.confirmed_stops(passed):
            self.stop_agents(reasons)

    def confirmed_stops(self, passed: dict[int, str]) -> dict[int, str]:
        """The stop rule: of the slots whose screening reached stop_at_return (`passed`: slot -> what the screening
        showed), those whose confirmation on `stop_confirm_episodes` fresh episodes reaches it too, each with the
        reason its record will give."""
        if not passed:
            return {}
        hp = self.config
        bar, n = hp.stop_at_return, int(hp.stop_confirm_episodes)
        if n == 0:
            return dict(passed)
        t0 = time.perf_counter()
        slots = list(passed)
        confirm = self.evaluation_returns(n, CONFIRM_SEED_OFFSET + n * self.confirmation_round(), slots)
        self.add_time("eval_confirm", time.perf_counter() - t0)
        reasons = {}
        for row, slot in enumerate(slots):
            agent, mean = self.slots[slot], float(confirm[row].mean())
            self.confirmations[agent].append((self.agent_env_steps(agent), mean))
            self._agent_row(agent, {"eval/confirm_return_mean": mean})
            if mean >= bar:
                reasons[slot] = f"{passed[slot]}, confirmed on {n} fresh episodes (mean {mean:.1f})"
        return reasons

    def note_evaluation(self, agent: int, mean: float, std: float, elapsed_s: float) -> None:
        """Agent `agent`'s evaluation now: kept for the record, a curve row, and the first time it reached the threshold."""
        self.evaluations[agent].append((self.agent_env_steps(agent), mean, std))
        self._agent_row(agent, {"eval/return_mean": mean, "eval/return_std": std})
        self.note_threshold(agent, mean, elapsed_s)

    def note_threshold(self, agent: int, mean: float, elapsed_s: float) -> None:
        """The first time agent `agent`'s screened return reached the threshold (its record's time_to_threshold_s)."""
        if self.threshold is not None and mean >= self.threshold and self.time_to_threshold_s[agent] is None:
            self.time_to_threshold_s[agent] = elapsed_s

    def keep_if_best(self, slot: int, agent: int, mean: float) -> None:
        """task.keep_best: when agent `agent`'s screening evaluation beats every earlier one (a resumed run's included:
        the checkpoint keeps `best`), its weights now are written to its best.pt at once, atomically, as its plain
        network's state_dict (what model.pt holds), and `best[agent]` says which evaluation they came from."""
        kept = self.best[agent]
        if not self.config.keep_best or (kept is not None and mean <= kept["return_mean"]):
            return
        self.best[agent] = {"file": BEST, "env_step": self.agent_env_steps(agent), "return_mean": mean}
        if self.record_dirs:
            t0 = time.perf_counter()
            path = best_path(self.record_dirs[agent])
            path.parent.mkdir(parents=True, exist_ok=True)
            save_atomic({k: v.detach().cpu() for k, v in self.net.member_state_dict(slot).items()}, path)
            self.add_time("best", time.perf_counter() - t0)

    def pruned_by_tuner(self) -> bool:
        """In an Optuna trial: report every agent's last evaluation (one that stopped early holds its last; dropping
        it would leave only the slow seeds in the trial's value and prune good trials). True when the trial is pruned."""
        if self.trial_reporter is None or not self.slots:
            return False
        everyone = [self.evaluations[a][-1][1] for a in range(self.n_agents) if self.evaluations[a]]
        return bool(self.trial_reporter.report(self.env_steps, everyone))

    def record_training_videos(self) -> None:
        """After an evaluation: every `video_every`-th one, a video of each learning agent's policy now (its plain
        network and its `agent_files`) through the lifecycle's `video_hook`."""
        every = int(self.config.video_every)
        if self.video_hook is None or every <= 0:
            return
        t0 = time.perf_counter()
        for slot, agent in enumerate(self.slots):
            if self.evaluations[agent] and len(self.evaluations[agent]) % every == 0:
                state = {k: v.detach().cpu() for k, v in self.net.member_state_dict(slot).items()}
                self.video_hook(agent, self.agent_env_steps(agent), state, self.agent_files(agent))
        self.add_time("video", time.perf_counter() - t0)

    # ---- logging -------------------------------------------------------------------------------------
    def _agent_row(self, agent: int, row: dict[str, float], step: int | None = None) -> None:
        step = self.agent_env_steps(agent) if step is None else step
        if self.curves:
            self.curves[agent].log(step, row)
        # The agent's own TensorBoard / W&B runs (its seed's), as they happen, with env steps as the x axis.
        for logger in self.agent_loggers[agent] if self.agent_loggers else []:
            logger.log_metrics({"env_step": step, **row}, step=step)

    def _log_shared(self, metrics: dict[str, float], step: int | None = None) -> None:
        # Batch-wide numbers straight to the trainer's loggers (env steps as the x axis): self.log per step is expensive.
        step = self.env_steps if step is None else step
        for logger in self.loggers:
            logger.log_metrics({"env_step": step, **metrics}, step=step)

    def log_progress(self) -> None:
        """A row per learning agent: its rate, the mean of its last 10 episodes' returns and the algorithm's metrics."""
        t0 = time.perf_counter()
        elapsed = max(self.elapsed_s(), 1e-9)
        for slot, agent in enumerate(self.slots):
            row = {"perf/env_steps_per_s": self.agent_env_steps(agent) / elapsed}
            if self.episode_returns[agent]:
                row["train/episodic_return"] = float(np.mean(self.episode_returns[agent][-10:]))
            row.update(self.train_metrics(slot, agent))
            self._agent_row(agent, row)
        if self.n_agents > 1:
            self._log_shared({"batch/env_steps_per_s": self.total_env_steps() / elapsed})
        self.last_log_step = self.env_steps
        self.add_time("log", time.perf_counter() - t0)

    def progress(self) -> Progress:
        """Env steps (per agent) against the budget, with the mean of the last 10 episodes' returns and the last
        evaluation (means over the agents still learning)."""
        agents, shown = self.learning_agents(), {}
        recent = [float(np.mean(self.episode_returns[a][-10:])) for a in agents if self.episode_returns[a]]
        if recent:
            shown["return"] = float(np.mean(recent))
        evaluated = [self.evaluations[a][-1][1] for a in agents if self.evaluations[a]]
        if evaluated:
            shown["eval"] = float(np.mean(evaluated))
        return Progress(*self.budget(), shown)

    # ---- checkpoints ---------------------------------------------------------------------------------
    def checkpoint_state(self) -> dict:
        """Everything needed to continue this run where it is (plain values: weights_only loads): the skeleton's keys
        and, beside them, `algorithm_state()`'s (a replay buffer under "replay" is what the record's checkpoint
        notes as `replay_saved`)."""
        state = {
            "format": self.checkpoint_format, "agent_seeds": self.agent_seeds, "config": asdict(self.config),
            "slots": list(self.slots),
            "progress": copy.deepcopy({f.name: getattr(self, f.name) for f in fields(self.RunProgress)}),
            "elapsed_s": self.elapsed_s(), "time_breakdown_s": dict(self.time_breakdown_s), "best": copy.deepcopy(self.best),
            **{name: getattr(self, name).state_dict() for name in self.checkpointed_nets},
            # The training loop's objects (they exist from train start on: restored by _restore_training_state).
            "optimizer": self.optimizers().optimizer.state_dict(),
            "generators": [g.get_state() for g in self.generators], "rng": rng_state(),
        }
        if self.vector_env:
            state.update(env=self.env.state_dict(), obs=self.obs, episode_return=self.episode_return)
        extra = self.algorithm_state()
        if clash := sorted(set(extra) & set(state)):
            raise TypeError(f"{type(self).__name__}.algorithm_state() uses the checkpoint's own keys {clash}: rename them")
        return {**state, **extra}

    @property
    def resume_step(self) -> int:
        return self.env_steps

    def check_checkpoint(self, state: dict) -> None:
        """A checkpoint of this algorithm's format, made for these agents' seeds; otherwise one line that says what differs."""
        if state.get("format") != self.checkpoint_format:
            raise ValueError(f"checkpoint format {state.get('format')!r} is not {self.checkpoint_format!r} (made by another version?)")
        seeds = list(state["agent_seeds"])
        if seeds != self.agent_seeds:
            raise ValueError(
                f"checkpoint holds seeds {seeds[0]}..{seeds[-1]} ({len(seeds)} agents), "
                f"this run has {self.agent_seeds[0]}..{self.agent_seeds[-1]}; resume with the same seed and seeds_per_process"
            )

    def load_checkpoint_state(self, state: dict) -> int:
        """Before fit: which agents still learn, the weights, the progress and the algorithm's state; the optimizer,
        RNGs and envs at train start."""
        self.check_checkpoint(state)
        slots = [int(s) for s in state["slots"]]
        if slots and slots != self.slots:
            self.keep_slots_([self.slots.index(s) for s in slots], training=False)
        self.slots = slots
        # With every agent stopped, only the record's weights matter (the learning nets are not used again).
        for name in self.checkpointed_nets if slots else ("agents_net",):
            try:
                getattr(self, name).load_state_dict(state[name])
            except RuntimeError as exc:
                raise ValueError(f"checkpoint weights do not fit this model (changed model.* since?): {str(exc).splitlines()[0]}") from None
        for f in fields(self.RunProgress):
            setattr(self, f.name, copy.deepcopy(state["progress"][f.name]))
        self._elapsed_before = float(state["elapsed_s"])
        self.time_breakdown_s = dict(state.get("time_breakdown_s") or {})
        self.best = list(state.get("best") or self.best)  # what each best.pt holds: a resumed run replaces only a worse one
        self.load_algorithm_state(state)
        self._resume = state
        return self.env_steps

    def _restore_training_state(self, state: dict) -> None:
        self.optimizers().optimizer.load_state_dict(state["optimizer"])
        if self.slots:
            for g, s in zip(self.generators, state["generators"]):
                g.set_state(s)
        if self.slots and self.vector_env:
            self.env.load_state_dict(state["env"])
            self.obs = state["obs"].to(self.device)
            self.episode_return = state["episode_return"].to(self.device)
            if self.env.restarted:  # envs that could not be restored start new episodes: their own first observation
                rows = torch.tensor(self.env.restarted, device=self.device)
                self.obs = self.obs.index_copy(0, rows, self.env.observation().to(self.device).index_select(0, rows))
                self.episode_return = self.episode_return.index_fill(0, rows, 0.0)
        self.resume_algorithm_state(state)
        set_rng_state(state["rng"])

    # ---- the contract with the lifecycle ---------------------------------------------------------------
    def fit_and_evaluate(self, trainer, datamodule, ckpt_path) -> list[dict[str, float]]:
        if trainer.precision not in FP32:
            raise ValueError(f"task={self.algorithm} runs in fp32; got device.precision={trainer.precision}, use device.precision=32-true")
        if self.iterations_left() > 0 and self.slots:
            trainer.fit(self)
        t0 = time.perf_counter()
        returns = self.evaluation_returns(self.config.final_eval_episodes, FINAL_EVAL_SEED_OFFSET)
        self.add_time("final_eval", time.perf_counter() - t0)
        self.final_metrics = []
        for i in range(self.n_agents):
            final = {"eval/return_mean": float(returns[i].mean()), "eval/return_std": float(returns[i].std())}
            self._agent_row(i, {f"final_{k}": v for k, v in final.items()}, step=self.agent_env_steps(i))
            self.final_metrics.append({**final, "train/episodes": float(len(self.episode_returns[i])), **self.final_agent_metrics(i)})
        if self.n_agents > 1:
            self._log_shared({"batch/final_eval_return_mean": float(returns.mean())})
        self.close_envs()
        return self.final_metrics

    def rl_record(self, i: int) -> dict:
        """The record fields of every RL agent: its env steps and their rate, the threshold and when it was reached,
        its evaluations and stop, and the range its returns can take (when the env says)."""
        seconds = self.stop_time_s[i] if self.stop_time_s[i] is not None else self._train_seconds
        env_steps = self.agent_env_steps(i)
        extras = {
            "env_id": self.env_id,
            "env_steps": env_steps,
            "env_steps_per_s": round(env_steps / seconds, 1) if seconds else None,
            "threshold": self.threshold,
            "time_to_threshold_s": None if self.time_to_threshold_s[i] is None else round(self.time_to_threshold_s[i], 3),
            "evaluations": [{"env_step": s, "return_mean": m, "return_std": sd} for s, m, sd in self.evaluations[i]],
            "early_stop": self.early_stop[i],
            "policy": f"{self.policy.__module__}.{self.policy.__qualname__}",
        }
        if self.config.keep_best:
            extras["best"] = self.best[i]
        if self.return_bounds is not None:
            lo, hi = self.return_bounds
            extras["metric_bounds"] = {"eval/return_mean": [lo, hi], "train/episodic_return": [lo, hi]}
        if self.n_agents > 1:
            extras["batch_env_steps_per_s"] = round(self.total_env_steps() / self._train_seconds, 1) if self._train_seconds else None
        return extras

    def agent_record(self, i: int) -> dict:
        return {**self.rl_record(i), **self.algorithm_record(i)}

    def agent_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Agent i's weights now as its plain network's state_dict (what model.pt holds)."""
        state = self.net.member_state_dict(self.slots.index(i)) if i in self.slots else self.agents_net.member_state_dict(i)
        return {k: v.detach().cpu() for k, v in state.items()}
