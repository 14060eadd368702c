"""The typed hyperparameters of every shipped task: one dataclass per task, the schema of its conf/task/ YAML.

Each task module builds from its dataclass (`Task.Config`): the lifecycle merges the `task:` node into it before
anything is written (`pipeline.runtime.run.check_task`), so a wrong type or an unknown key is one line. Torch-free on
purpose, so the CLI can check them (or register them with Hydra's ConfigStore) without loading torch. A task of
your own keeps its Config next to it (docs/add_an_algorithm.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DQNConfig:
    """DQN's hyperparameters: the keys of conf/task/dqn.yaml (which says what each one does)."""

    _target_: str = "pipeline.tasks.dqn.DQNTask"

    total_steps: int = 50_000  # env steps per agent
    envs_per_agent: int = 1
    buffer_size: int = 100_000
    batch_size: int = 64
    gamma: float = 0.99
    learning_starts: int = 1_000
    train_frequency: int = 256
    gradient_steps: int = 128
    target_update: str = "hard"  # hard | soft
    target_update_interval: int = 10
    tau: float = 0.005
    double_dqn: bool = False
    max_grad_norm: float | None = 10.0
    eps_start: float = 1.0
    eps_end: float = 0.04
    eps_duration: int = 8_000
    eval_every: int = 2_500
    eval_episodes: int = 10
    final_eval_episodes: int = 20
    stop_at_return: float | None = None
    log_every: int = 1_000
    threshold: float | None = None
    fast_acting: bool = True
    hand_gradients: bool = True
    save_replay: Any = "auto"  # true | false | auto
    replay_save_max_mb: float = 512.0
    capture_video: bool = False
    video_every: int = 0  # every N-th evaluation during training, a video of each learning agent (0: none)


@dataclass
class CEMConfig:
    """CEM's hyperparameters: the keys of conf/task/cem.yaml."""

    _target_: str = "pipeline.tasks.cem.CEMTask"

    episodes_per_batch: int = 16
    elite_percentile: float = 70.0  # keep episodes at or above this percentile of the batch's returns
    fit_epochs: int = 1
    max_iterations: int = 200
    stop_at_return: float | None = 475.0
    final_eval_episodes: int = 20
    threshold: float | None = None


@dataclass
class SupervisedConfig:
    """The supervised task's hyperparameters: the keys of conf/task/supervised.yaml."""

    _target_: str = "pipeline.tasks.supervised.SupervisedTask"

    scheduler_interval: str = "epoch"  # epoch | step: when the scheduler steps


@dataclass
class ClassifierSettings:
    """The quality classifier: a supervised run's model.pt (`path`), or one trained on the fly and cached."""

    path: str | None = None
    hidden: list[int] = field(default_factory=lambda: [128, 64])
    act: str = "relu"
    dropout: float = 0.2
    epochs: int = 60
    lr: float = 0.002
    weight_decay: float = 0.0001
    batch_size: int = 64
    seed: int = 0


@dataclass
class FrameFeatureSettings:
    """The fixed random-conv feature space that frames without labels are scored in."""

    feature_seed: int = 0
    channels: list[int] = field(default_factory=lambda: [16, 32, 64])
    pooled_size: int = 8


@dataclass
class GANConfig:
    """The GAN task's hyperparameters: the keys of conf/task/gan.yaml (which says what each one does)."""

    _target_: str = "pipeline.tasks.gan.GANTask"

    d_steps_per_g_step: int = 1
    label_smoothing: float = 0.0
    quality: str = "auto"  # auto | classifier | frames
    classifier: ClassifierSettings = field(default_factory=ClassifierSettings)
    frame_features: FrameFeatureSettings = field(default_factory=FrameFeatureSettings)
    n_eval_samples: int = 1000
    coverage_threshold: float = 0.25
    cache_dir: str | None = None
    eval_every_n_epochs: int = 10
    sample_every_n_epochs: int = 10
    n_grid_samples: int = 64
    log_every_n_steps: int = 50
    histogram_every_n_steps: int = 500
    log_graph: bool = True


@dataclass
class CounterfactualConfig:
    """The counterfactual task's settings: the keys of conf/task/counterfactual.yaml (which says what each one does)."""

    _target_: str = "pipeline.tasks.counterfactual.CounterfactualTask"

    rules: list[str] | None = None
    epsilons: list[float] = field(default_factory=lambda: [0.001, 0.005, 0.02])
    statistics: list[str] = field(default_factory=lambda: ["revenue", "welfare"])
    n_iters: int = 200
    point_iters: int = 1000
    grid: float = 0.01
    value_top: float | None = None


@dataclass
class PPOConfig:
    """PPO's hyperparameters: the keys of conf/task/ppo.yaml (which says what each one does). Defaults: CleanRL's ppo.py."""

    _target_: str = "pipeline.tasks.ppo.PPOTask"
    total_steps: int = 500_000  # env steps per agent
    envs_per_agent: int = 4
    num_steps: int = 128  # steps per env in a rollout
    num_minibatches: int = 4
    update_epochs: int = 4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    clip_value_loss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float | None = 0.5
    norm_adv: bool = True
    anneal_lr: bool = True
    normalize_obs: bool = False
    normalize_reward: bool = False
    obs_clip: float = 10.0
    reward_clip: float = 10.0
    eval_every: int = 10_000
    eval_episodes: int = 10
    final_eval_episodes: int = 20
    stop_at_return: float | None = None  # an agent whose evaluation mean reaches this stops learning (null: never)
    log_every: int = 2_048
    threshold: float | None = None
    capture_video: bool = False
    video_every: int = 0  # every N-th evaluation during training, a video of each agent (0: none)


# Each shipped task option (conf/task/<name>.yaml) and its schema.
SCHEMAS = {
    "dqn": DQNConfig,
    "cem": CEMConfig,
    "supervised": SupervisedConfig,
    "gan": GANConfig,
    "counterfactual": CounterfactualConfig,
    "ppo": PPOConfig,
}
