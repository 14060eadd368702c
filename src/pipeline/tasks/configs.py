"""The typed hyperparameters of every shipped task: one dataclass per task, the schema of its conf/task/ YAML.

Each task module builds from its dataclass (`Task.Config`): the start-up check (`pipeline.config.startup.check_run`)
merges the `task:` node into it once, before anything is written, so a wrong type or an unknown key is one line.
Torch-free on purpose, so the start-up check reads them without loading torch. A task of your own keeps its Config
next to it (docs/add_an_algorithm.md).

Valid ranges are declared on the fields (`pipeline.config.ranges`): `total_steps: int = count(50_000)` is a whole
number >= 1, `gamma: float = unit(0.99)` a number in [0, 1], `clip_coef: float = positive(0.2)` a finite number > 0,
`target_update: str = one_of("hard", "soft")`; a float is finite unless declared otherwise, and `| None` admits null.
Rules between fields are a `cross_checks()` method yielding (field, what is wrong).

Everything a task declares for start-up is a class variable of its Config (a Config that leaves one out gets the
default in brackets):
- `uses`: the config groups the task takes (model, loss, optimizer, scheduler, env, data); any other must be `none`
  [none];
- `trains_seeds_together`: K seeds train in one process (`seeds_per_process=K`) [False: K > 1 is refused];
- `monitorable_metrics`: the metrics a configured EarlyStopping or ModelCheckpoint may `monitor` (`()`: none)
  [None: not checked];
- `precisions`: the `device.precision` values it trains in [None: any];
- `action_spaces`: "discrete" and/or "box" [None: no env];
- `data_parallel`: trainer=ddp may shard its data loader over processes [False];
- `model_contract`: what the task passes to a model's constructor and calls on it (`pipeline.nets.contracts`),
  checked against a model of the user's own [None: not checked].
`pipeline.config.startup.check_run` checks all of it once, before Lightning is imported: one line naming the key and
a valid example, exit 2, no run dir.

The RL configs share `RLBatchConfig` (the K-agent batch's evaluation, logging, stop rule, videos and best weights),
extended by `RLConfig` (the env-step budget and the vector env: every step-based algorithm) and, off-policy,
`OffPolicyConfig` (the replay buffer: `pipeline.tasks.offpolicy.OffPolicyTask`) and `OffPolicyActorCriticConfig`
(an actor and critics: SAC, TD3); a new algorithm's Config extends one and declares only its own fields (a
whole-episode algorithm such as CEM extends RLBatchConfig).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pipeline.config.ranges import count, items, number, one_of, positive, unit
from pipeline.nets import contracts
from pipeline.nets.contracts import ModelContract

FP32 = ("32-true", "32")  # what the RL tasks train in


@dataclass
class RLBatchConfig:
    """What RLTask reads for every RL algorithm's K-agent batch: evaluation, logging, the stop rule, videos, best
    weights. Step-based algorithms extend `RLConfig` (which adds the env-step budget and the vector env); an
    algorithm that plays whole episodes on envs of its own (CEM) extends this one."""

    uses: ClassVar[frozenset[str]] = frozenset({"model", "optimizer", "env"})
    trains_seeds_together: ClassVar[bool] = True
    monitorable_metrics: ClassVar[tuple[str, ...] | None] = ()  # it stops by itself: task.stop_at_return
    precisions: ClassVar[tuple[str, ...] | None] = FP32
    action_spaces: ClassVar[tuple[str, ...] | None] = ("discrete", "box")

    eval_every: int = count(2_500)  # env steps between evaluations
    eval_episodes: int = count(10)
    final_eval_episodes: int = count(20)
    stop_at_return: float | None = number(None, example=475.0)  # an agent reaching this stops learning (null: never)
    # The stop rule (pipeline.tasks.rl_task): an evaluation reaching stop_at_return is confirmed on this many fresh
    # episodes before the agent stops (0: the evaluation alone decides).
    stop_confirm_episodes: int = count(30, low=0, note="0: the evaluation alone decides")
    log_every: int = count(1_000)
    threshold: float | None = number(None, example=475.0)  # solved at this return (null: the env's reward_threshold)
    capture_video: bool = False
    video_every: int = count(0, low=0, note="0: none")  # every N-th evaluation, a video of each learning agent
    # Each agent keeps its best-evaluated weights as best.pt beside model.pt (SB3's EvalCallback habit).
    keep_best: bool = one_of(False, True)

    def cross_checks(self) -> Iterator[tuple[str, str]]:
        if self.keep_best and self.eval_every == 0:
            yield "keep_best", "needs evaluations to pick the best weights by; e.g. task.eval_every=2500 (or task.keep_best=false)"


@dataclass
class RLConfig(RLBatchConfig):
    """What every step-based RL task reads: RLBatchConfig's keys, the env-step budget and the vector env."""

    total_steps: int = count(50_000)  # env steps per agent
    envs_per_agent: int = count(1)
    gamma: float = unit(0.99)


@dataclass
class OffPolicyConfig(RLConfig):
    """What the off-policy layer reads (`pipeline.tasks.offpolicy.OffPolicyTask`): each agent's replay buffer, its
    minibatches, when learning starts, and whether checkpoints hold the buffer."""

    buffer_size: int = count(100_000)
    batch_size: int = count(64)
    learning_starts: int = count(1_000, low=0)
    save_replay: Any = one_of("auto", True, False)  # keep the replay buffer in checkpoints (auto: if under the cap)
    replay_save_max_mb: float = number(512.0, low=0)

    def cross_checks(self) -> Iterator[tuple[str, str]]:
        yield from super().cross_checks()
        if self.batch_size > self.buffer_size:
            yield "batch_size", f"is larger than task.buffer_size={self.buffer_size}; e.g. task.batch_size={min(64, self.buffer_size)}"
        if self.learning_starts >= self.total_steps:
            yield "learning_starts", (f"is not below task.total_steps={self.total_steps}: the run would end before its first "
                                      f"update; e.g. task.learning_starts={self.total_steps // 10}, or a larger task.total_steps")


@dataclass
class DQNConfig(OffPolicyConfig):
    """DQN's hyperparameters: the keys of conf/task/dqn.yaml (which says what each one does)."""

    uses: ClassVar[frozenset[str]] = frozenset({"model", "loss", "optimizer", "scheduler", "env"})
    action_spaces: ClassVar[tuple[str, ...] | None] = ("discrete",)
    model_contract: ClassVar[ModelContract | None] = contracts.DQN

    _target_: str = "pipeline.tasks.dqn.DQNTask"

    train_frequency: int = count(256)
    gradient_steps: int = count(128, low=0)
    target_update: str = one_of("hard", "soft")
    target_update_interval: int = count(10)
    tau: float = number(0.005, low=0, high=1, low_open=True)
    double_dqn: bool = False
    max_grad_norm: float | None = positive(10.0)
    eps_start: float = unit(1.0)
    eps_end: float = unit(0.04)
    eps_duration: int = count(8_000, low=0)
    fast_acting: bool = True
    hand_gradients: bool = True

    def cross_checks(self) -> Iterator[tuple[str, str]]:
        yield from super().cross_checks()
        if self.train_frequency % self.envs_per_agent:
            yield "train_frequency", (f"must be a multiple of task.envs_per_agent={self.envs_per_agent} (env steps per "
                                      f"agent between updates); e.g. task.train_frequency={256 * self.envs_per_agent}")


@dataclass
class PPOConfig(RLConfig):
    """PPO's hyperparameters: the keys of conf/task/ppo.yaml (which says what each one does). Defaults: CleanRL's ppo.py.

    ent_coef may be 0 (no entropy bonus) but not negative: a negative coefficient rewards collapsing the policy."""

    model_contract: ClassVar[ModelContract | None] = contracts.PPO

    _target_: str = "pipeline.tasks.ppo.PPOTask"
    total_steps: int = count(500_000)  # env steps per agent
    envs_per_agent: int = count(4)
    num_steps: int = count(128)  # steps per env in a rollout
    num_minibatches: int = count(4)
    update_epochs: int = count(4)
    gae_lambda: float = unit(0.95)
    clip_coef: float = positive(0.2)
    clip_value_loss: bool = True
    ent_coef: float = number(0.01, low=0)
    vf_coef: float = positive(0.5)
    max_grad_norm: float | None = positive(0.5)
    norm_adv: bool = True
    anneal_lr: bool = True
    normalize_obs: bool = False
    normalize_reward: bool = False
    obs_clip: float = positive(10.0)
    reward_clip: float = positive(10.0)
    eval_every: int = count(10_000)
    log_every: int = count(2_048)

    def cross_checks(self) -> Iterator[tuple[str, str]]:
        yield from super().cross_checks()
        if self.keep_best and self.normalize_obs:
            yield "keep_best", ("is not kept with task.normalize_obs=true (the best weights would need the observation "
                                "statistics of their evaluation); e.g. task.keep_best=false")
        batch = self.num_steps * self.envs_per_agent
        if batch % self.num_minibatches:
            yield "num_minibatches", (f"does not divide the rollout of task.num_steps * task.envs_per_agent = {self.num_steps} * "
                                      f"{self.envs_per_agent} = {batch} samples into equal minibatches; e.g. task.num_minibatches="
                                      f"{max(d for d in range(1, min(batch, 4) + 1) if batch % d == 0)}")
        if self.total_steps < batch:
            yield "total_steps", (f"is less than one rollout (task.num_steps * task.envs_per_agent = {batch} env steps per "
                                  f"agent); e.g. task.total_steps={max(batch, 500_000)}")


@dataclass
class OffPolicyActorCriticConfig(OffPolicyConfig):
    """What the off-policy actor-critic tasks read (SAC, TD3; `pipeline.tasks.offpolicy.OffPolicyActorCriticTask`): an
    actor and critics learning at every env step, each at its own rate (the optimizer group's lr is not used)."""

    action_spaces: ClassVar[tuple[str, ...] | None] = ("box",)

    total_steps: int = count(1_000_000)
    buffer_size: int = count(1_000_000)
    batch_size: int = count(256)
    tau: float = number(0.005, low=0, high=1, low_open=True)  # Polyak factor of the target networks
    policy_lr: float = positive(3e-4)  # the actor's learning rate
    q_lr: float = positive(3e-4)  # the critics' learning rate
    # Critic updates per actor update (SAC: the actor and its temperature then step this many times; TD3: the targets
    # move with each actor update).
    policy_frequency: int = count(2)
    critic_hidden: list[int] = items([256, 256], whole=True, low=1)  # each Q critic's hidden layers
    eval_every: int = count(5_000)


@dataclass
class SACConfig(OffPolicyActorCriticConfig):
    """SAC's hyperparameters (twin Q critics, a squashed-Gaussian actor, entropy tuning). Defaults: CleanRL's
    sac_continuous_action.py."""

    model_contract: ClassVar[ModelContract | None] = contracts.SAC

    _target_: str = "pipeline.tasks.sac.SACTask"
    learning_starts: int = count(5_000, low=0)
    q_lr: float = positive(1e-3)  # the critics' and the temperature's learning rate
    target_network_frequency: int = count(1)  # critic updates per target update
    alpha: float = number(0.2, low=0)  # the entropy coefficient when autotune=false
    autotune: bool = True  # tune alpha toward a target entropy of -dim(action)
    alpha_start: float = positive(1.0)  # autotune's start value (CleanRL: log_alpha = 0, i.e. 1.0)
    # autotune's loss: "cleanrl" -alpha (log pi + target) on a fresh draw after the actor step (CleanRL's);
    # "log_alpha" -log_alpha (log pi + target) on the actor step's own draw (SB3's; alpha falls faster once small).
    temperature_loss: str = one_of("cleanrl", "log_alpha")
    # The tanh squashing's log-det: 0 exact, log(1 - tanh(u)^2) in a stable form; CleanRL's and SB3's 1e-6 gives
    # log(1 - a^2 + 1e-6), biased once |a| nears 1.
    log_det_epsilon: float = number(0.0, low=0)
    target_entropy: float | None = number(None, example=-1.0)  # autotune's target (null: -dim(action))


@dataclass
class TD3Config(OffPolicyActorCriticConfig):
    """TD3's hyperparameters (twin Q critics, target policy smoothing, delayed actor updates). Defaults: CleanRL's
    td3_continuous_action.py (its one learning_rate is policy_lr and q_lr here)."""

    model_contract: ClassVar[ModelContract | None] = contracts.TD3

    _target_: str = "pipeline.tasks.td3.TD3Task"
    learning_starts: int = count(25_000, low=0)
    policy_noise: float = number(0.2, low=0)  # target policy smoothing noise, in units of the action scale
    exploration_noise: float = number(0.1, low=0)
    noise_clip: float = number(0.5, low=0)


@dataclass
class CEMConfig(RLBatchConfig):
    """CEM's hyperparameters: the keys of conf/task/cem.yaml. It plays whole episodes on envs of its own, so its
    budget is iterations (no total_steps / envs_per_agent / gamma); its stop rule screens each iteration's batch."""

    uses: ClassVar[frozenset[str]] = frozenset({"model", "optimizer", "loss", "env"})
    action_spaces: ClassVar[tuple[str, ...] | None] = ("discrete",)
    model_contract: ClassVar[ModelContract | None] = contracts.CEM

    _target_: str = "pipeline.tasks.cem.CEMTask"

    episodes_per_batch: int = count(16)
    elite_percentile: float = number(70.0, low=0, high=100)  # keep episodes at or above this percentile of the batch's returns
    fit_epochs: int = count(1)
    max_iterations: int = count(200)
    stop_at_return: float | None = number(None, example=475.0)  # on the env's scale: the presets set it
    # A batch mean reaching stop_at_return is confirmed on this many fresh greedy episodes before the agent stops
    # (their mean must reach it too); 0: the batch alone decides.
    stop_confirm_episodes: int = count(30, low=0, note="0: the batch alone decides")
    eval_every: int = count(0, low=0, note="0: none; the stop rule screens every batch")  # env steps between greedy evaluations
    log_every: int = count(1)  # env steps between log rows (1: a row per iteration)


@dataclass
class SupervisedConfig:
    """The supervised task's hyperparameters: the keys of conf/task/supervised.yaml."""

    uses: ClassVar[frozenset[str]] = frozenset({"model", "loss", "optimizer", "scheduler", "data"})
    trains_seeds_together: ClassVar[bool] = True
    # Logged for callbacks under metrics.csv's names (the members' means when K > 1): EarlyStopping and
    # ModelCheckpoint monitor one of these (conf/callbacks/early_stopping.yaml: val/acc, mode max).
    monitorable_metrics: ClassVar[tuple[str, ...] | None] = ("val/acc", "val/loss", "train/loss")
    data_parallel: ClassVar[bool] = True
    model_contract: ClassVar[ModelContract | None] = contracts.SUPERVISED

    _target_: str = "pipeline.tasks.supervised.SupervisedTask"

    scheduler_interval: str = one_of("epoch", "step")  # when the scheduler steps


@dataclass
class ClassifierSettings:
    """The quality classifier: a supervised run's model.pt (`path`), or one trained on the fly and cached."""

    path: str | None = None
    hidden: list[int] = items([128, 64], whole=True, low=1)
    act: str = "relu"
    dropout: float = number(0.2, low=0, high=1, high_open=True)
    epochs: int = count(60)
    lr: float = positive(0.002)
    weight_decay: float = number(0.0001, low=0)
    batch_size: int = count(64)
    seed: int = count(0, low=0)


@dataclass
class FrameFeatureSettings:
    """The fixed random-conv feature space that frames without labels are scored in."""

    feature_seed: int = count(0, low=0)
    channels: list[int] = items([16, 32, 64], whole=True, low=1)
    pooled_size: int = count(8)


@dataclass
class GANConfig:
    """The GAN task's hyperparameters: the keys of conf/task/gan.yaml (which says what each one does)."""

    uses: ClassVar[frozenset[str]] = frozenset({"model", "loss", "optimizer", "scheduler", "data"})
    # Nothing for EarlyStopping or ModelCheckpoint: the losses are adversarial (no measure of progress), and
    # sample quality is scored every task.eval_every_n_epochs, outside Lightning's metrics.
    monitorable_metrics: ClassVar[tuple[str, ...] | None] = ()
    data_parallel: ClassVar[bool] = True
    model_contract: ClassVar[ModelContract | None] = contracts.GAN

    _target_: str = "pipeline.tasks.gan.GANTask"

    d_steps_per_g_step: int = count(1)
    label_smoothing: float = number(0.0, low=0, high=0.5, high_open=True)
    quality: str = one_of("auto", "classifier", "frames")
    classifier: ClassifierSettings = field(default_factory=ClassifierSettings)
    frame_features: FrameFeatureSettings = field(default_factory=FrameFeatureSettings)
    n_eval_samples: int = count(1000)
    coverage_threshold: float = positive(0.25)
    cache_dir: str | None = None
    eval_every_n_epochs: int = count(10, low=0, note="0: never")
    sample_every_n_epochs: int = count(10, low=0, note="0: never")
    n_grid_samples: int = count(64)
    log_every_n_steps: int = count(50, low=0, note="0: never")
    histogram_every_n_steps: int = count(500, low=0, note="0: never")
    log_graph: bool = True


@dataclass
class CounterfactualConfig:
    """The counterfactual task's settings: the keys of conf/task/counterfactual.yaml (which says what each one does)."""

    uses: ClassVar[frozenset[str]] = frozenset({"data"})
    monitorable_metrics: ClassVar[tuple[str, ...] | None] = ()  # nothing is trained

    _target_: str = "pipeline.tasks.counterfactual.CounterfactualTask"

    rules: list[str] | None = None
    epsilons: list[float] = items([0.001, 0.005, 0.02], low=0, low_open=True)
    statistics: list[str] = items(["revenue", "welfare"], choices=("revenue", "welfare"))
    n_iters: int = count(200, low=0)
    point_iters: int = count(1000)
    grid: float = number(0.01, low=0, high=1, low_open=True, high_open=True)
    value_top: float | None = positive(None, example=1.0)


# Each shipped task option (conf/task/<name>.yaml) and its schema.
SCHEMAS = {
    "dqn": DQNConfig,
    "cem": CEMConfig,
    "supervised": SupervisedConfig,
    "gan": GANConfig,
    "counterfactual": CounterfactualConfig,
    "ppo": PPOConfig,
    "sac": SACConfig,
    "td3": TD3Config,
}
