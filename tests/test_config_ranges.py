"""Valid ranges declared on the typed task Configs (pipeline.config.ranges), and the start-up check that applies them
(pipeline.config.task_settings via checks.check_values): each bad setting is one line naming the key, what it must
be and a valid example, before Lightning loads."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf, open_dict

from pipeline.config import checks, data_settings, env_ids, ranges
from pipeline.config.checks import ConfigError
from pipeline.config.ranges import count, items, number, one_of, positive, unit
from pipeline.config.task_settings import configs_by_target
from pipeline.tasks import configs


def composed(*overrides: str):
    """(config, choices) as the CLI composes them."""
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    choices = checks.runtime_choices(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def refusal(*overrides: str) -> str:
    cfg, choices = composed(*overrides)
    with pytest.raises(ConfigError) as info:
        checks.check_values(cfg, choices)
    line = str(info.value)
    assert "\n" not in line
    return line


# ---- the declarations ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Inner:
    width: int = count(4)


@dataclasses.dataclass
class Example:
    _target_: str = "x.Y"
    steps: int = count(10)
    every: int = count(0, low=0, note="0: never")
    gamma: float = unit(0.9)
    coef: float = positive(0.2)
    bonus: float = number(0.0, low=0)
    free: float = number(1.0, finite=False)
    cap: float | None = positive(None, example=2.5)
    mode: str = one_of("hard", "soft")
    flag: object = one_of("auto", True, False)
    widths: list[int] = items([8, 8], whole=True, low=1)
    inner: Inner = dataclasses.field(default_factory=Inner)

    def cross_checks(self):
        if self.steps % 2:
            yield "steps", "must be even; e.g. task.steps=10"


def lines(**values) -> list[str]:
    return list(ranges.problems(Example(**values), "task"))


def test_defaults_pass_and_each_kind_of_range_names_key_rule_and_example():
    assert lines() == []
    assert lines(steps=0) == ["task.steps=0: must be a whole number >= 1; e.g. task.steps=10"]
    assert lines(steps=2.5) == ["task.steps=2.5: must be a whole number >= 1; e.g. task.steps=10"]
    assert lines(every=-1) == ["task.every=-1: must be a whole number >= 0 (0: never); e.g. task.every=0"]
    assert lines(gamma=1.5) == ["task.gamma=1.5: must be a finite number in [0, 1]; e.g. task.gamma=0.9"]
    assert lines(coef=0) == ["task.coef=0: must be a finite number > 0; e.g. task.coef=0.2"]
    assert lines(coef=math.inf) == ["task.coef=inf: must be a finite number > 0; e.g. task.coef=0.2"]
    assert lines(bonus=math.nan) == ["task.bonus=nan: must be a finite number >= 0; e.g. task.bonus=0.0"]
    assert lines(cap=0.0) == ["task.cap=0.0: must be a finite number > 0; e.g. task.cap=2.5"]
    assert lines(mode="polyak") == ["task.mode=polyak: must be one of hard, soft; e.g. task.mode=hard"]
    assert lines(flag="yes") == ["task.flag=yes: must be one of auto, true, false; e.g. task.flag=auto"]
    assert lines(flag=1) == ["task.flag=1: must be one of auto, true, false; e.g. task.flag=auto"]  # 1 is not true
    assert lines(flag=None) == ["task.flag=null: must be one of auto, true, false; e.g. task.flag=auto"]  # `object`: no null
    assert lines(widths=[8, 0]) == ["task.widths=[8,0]: must be a list, each item a whole number >= 1; e.g. task.widths=[8,8]"]
    assert lines(inner=Inner(width=0)) == ["task.inner.width=0: must be a whole number >= 1; e.g. task.inner.width=4"]
    assert lines(coef=True) == ["task.coef=true: must be a finite number > 0; e.g. task.coef=0.2"]  # a flag is no number


def test_edges_null_and_non_finite_where_declared():
    assert lines(gamma=0, every=0, bonus=0, cap=None, free=math.inf, flag=False, widths=[]) == []
    assert lines(gamma=1.0, steps=10**12, cap=1e-300) == []
    assert lines(free=math.nan) == []  # finite=False and no bounds: anything numeric


def test_a_cross_field_rule_runs_only_when_every_field_is_in_range():
    assert lines(steps=3) == ["task.steps=3: must be even; e.g. task.steps=10"]
    assert lines(steps=3, coef=0) == ["task.coef=0: must be a finite number > 0; e.g. task.coef=0.2"]


def test_the_value_shown_is_the_one_typed():
    assert list(ranges.problems(Example(coef=0.0), "task", {"coef": 0})) == ["task.coef=0: must be a finite number > 0; e.g. task.coef=0.2"]
    with pytest.raises(ConfigError, match=r"^task\.steps=3: must be even"):
        ranges.check_config(Example(steps=3))


# ---- the shipped Configs ------------------------------------------------------------------------------------

ALL = [configs.DQNConfig, configs.PPOConfig, configs.SACConfig, configs.TD3Config, configs.CEMConfig,
       configs.SupervisedConfig, configs.GANConfig, configs.CounterfactualConfig]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_shipped_default_is_in_range(cls):
    ranges.check_config(cls())


def test_every_setting_with_a_range_declares_it():
    """What is left unchecked: flags, strings, paths, and the rule names a game parses."""
    flags = {"capture_video", "_target_"}
    unchecked = {c.__name__: set(ranges.unchecked_fields(c)) - flags for c in ALL}
    assert unchecked == {
        "DQNConfig": {"double_dqn", "fast_acting", "hand_gradients"},
        "PPOConfig": {"clip_value_loss", "norm_adv", "anneal_lr", "normalize_obs", "normalize_reward"},
        "SACConfig": {"autotune"},
        "TD3Config": set(),
        "CEMConfig": set(),
        "SupervisedConfig": set(),
        "GANConfig": {"classifier.path", "classifier.act", "cache_dir", "log_graph"},
        "CounterfactualConfig": {"rules"},
    }


def test_the_rl_configs_share_one_base_and_declare_what_they_run_with():
    for cls in (configs.DQNConfig, configs.PPOConfig, configs.SACConfig, configs.TD3Config):
        assert issubclass(cls, configs.RLConfig) and cls.precisions == ("32-true", "32")
    assert configs.DQNConfig.action_spaces == ("discrete",) and configs.PPOConfig.action_spaces == ("discrete", "box")
    assert configs.SACConfig.action_spaces == configs.TD3Config.action_spaces == ("box",)
    assert getattr(configs.GANConfig, "precisions", None) is None


def test_a_new_algorithms_config_declares_only_its_own_fields():
    @dataclasses.dataclass
    class MineConfig(configs.OffPolicyConfig):
        _target_: str = "mine.MineTask"
        noise: float = unit(0.1)

    ranges.check_config(MineConfig())
    assert list(ranges.problems(MineConfig(noise=2), "task")) == [
        "task.noise=2: must be a finite number in [0, 1]; e.g. task.noise=0.1"]
    assert list(ranges.problems(MineConfig(eval_episodes=0), "task")) == [  # the RL batch's ranges, inherited
        "task.eval_episodes=0: must be a whole number >= 1; e.g. task.eval_episodes=10"]
    assert list(ranges.problems(MineConfig(batch_size=10, buffer_size=5), "task")) == [  # and the replay's rule
        "task.batch_size=10: is larger than task.buffer_size=5; e.g. task.batch_size=5"]
    assert MineConfig.precisions == ("32-true", "32")


def test_sac_and_td3_start_from_cleanrls_defaults():
    """CleanRL's sac_continuous_action.py and td3_continuous_action.py (their Args), read by hand."""
    sac = dataclasses.asdict(configs.SACConfig())
    assert {k: sac[k] for k in ("total_steps", "buffer_size", "gamma", "tau", "batch_size", "learning_starts", "policy_lr",
                                "q_lr", "policy_frequency", "target_network_frequency", "alpha", "autotune")} == {
        "total_steps": 1_000_000, "buffer_size": 1_000_000, "gamma": 0.99, "tau": 0.005, "batch_size": 256,
        "learning_starts": 5_000, "policy_lr": 3e-4, "q_lr": 1e-3, "policy_frequency": 2, "target_network_frequency": 1,
        "alpha": 0.2, "autotune": True}
    td3 = dataclasses.asdict(configs.TD3Config())
    assert {k: td3[k] for k in ("total_steps", "buffer_size", "gamma", "tau", "batch_size", "learning_starts", "policy_lr",
                                "q_lr", "policy_frequency", "policy_noise", "exploration_noise", "noise_clip")} == {
        "total_steps": 1_000_000, "buffer_size": 1_000_000, "gamma": 0.99, "tau": 0.005, "batch_size": 256,
        "learning_starts": 25_000, "policy_lr": 3e-4, "q_lr": 3e-4, "policy_frequency": 2, "policy_noise": 0.2,
        "exploration_noise": 0.1, "noise_clip": 0.5}
    rl = {"envs_per_agent", "eval_every", "eval_episodes", "final_eval_episodes", "stop_at_return", "log_every", "threshold",
          "capture_video", "video_every", "save_replay", "replay_save_max_mb"}
    assert rl <= set(sac) and rl <= set(td3)
    assert configs.SACConfig._target_ == "pipeline.tasks.sac.SACTask" and configs.TD3Config._target_ == "pipeline.tasks.td3.TD3Task"


def test_the_auction_data_config_is_its_yaml_and_its_classs_arguments():
    """pipeline.config.data_settings declares the ranges of a data module that lives below the config layer: it must
    keep the module's arguments, the shipped YAML's keys and defaults, and the bidder limit."""
    import inspect

    from pipeline.data.auction import AuctionBidsData
    from pipeline.games.bids_csv import MAX_BIDDERS

    defaults = dataclasses.asdict(data_settings.AuctionBidsDataConfig())
    assert defaults.pop("_target_") == f"{AuctionBidsData.__module__}.{AuctionBidsData.__name__}"
    shipped = OmegaConf.to_container(OmegaConf.load(str(checks.conf_root() / "data" / "auction_bids.yaml")))
    shipped.pop("_target_")
    assert shipped == defaults
    params = inspect.signature(AuctionBidsData.__init__).parameters
    assert {k: p.default for k, p in params.items() if k != "self"} == defaults
    assert data_settings.MAX_BIDDERS == MAX_BIDDERS


def test_the_start_up_check_finds_each_shipped_task_config_by_its_target():
    found = configs_by_target()
    for name, cls in configs.SCHEMAS.items():
        target = OmegaConf.load(str(checks.conf_root() / "task" / f"{name}.yaml"))._target_
        assert found[target] is cls
    assert found["pipeline.tasks.sac.SACTask"] is configs.SACConfig


# ---- at start-up, on composed configs ------------------------------------------------------------------------

PPO = "experiment=ppo_cartpole"  # num_steps 32 x envs_per_agent 8 = 256 env steps per rollout


@pytest.mark.parametrize(("overrides", "line"), [
    ((PPO, "task.clip_coef=0"), "task.clip_coef=0: must be a finite number > 0; e.g. task.clip_coef=0.2"),
    ((PPO, "task.clip_coef=-0.2"), "task.clip_coef=-0.2: must be a finite number > 0; e.g. task.clip_coef=0.2"),
    ((PPO, "task.ent_coef=-1"), "task.ent_coef=-1: must be a finite number >= 0; e.g. task.ent_coef=0.01"),
    ((PPO, "task.gae_lambda=2"), "task.gae_lambda=2: must be a finite number in [0, 1]; e.g. task.gae_lambda=0.95"),
    ((PPO, "task.envs_per_agent=0"), "task.envs_per_agent=0: must be a whole number >= 1; e.g. task.envs_per_agent=4"),
    ((PPO, "task.num_minibatches=3"), "task.num_minibatches=3: does not divide the rollout of task.num_steps * "
                                      "task.envs_per_agent = 32 * 8 = 256 samples into equal minibatches; e.g. task.num_minibatches=4"),
    ((PPO, "task.total_steps=100"), "task.total_steps=100: is less than one rollout (task.num_steps * task.envs_per_agent = "
                                    "256 env steps per agent); e.g. task.total_steps=500000"),
    ((PPO, "task.update_epochs=0"), "task.update_epochs=0: must be a whole number >= 1; e.g. task.update_epochs=4"),
    ((PPO, "task.eval_episodes=0"), "task.eval_episodes=0: must be a whole number >= 1; e.g. task.eval_episodes=10"),
    ((PPO, "task.vf_coef=nan"), "task.vf_coef=nan: must be a finite number > 0; e.g. task.vf_coef=0.5"),
    ((PPO, "optimizer.lr=nan"), "optimizer.lr=nan: a learning rate is a finite number > 0; e.g. optimizer.lr=0.001"),
    ((PPO, "optimizer.lr=inf"), "optimizer.lr=inf: a learning rate is a finite number > 0; e.g. optimizer.lr=0.001"),
    ((PPO, "task.stop_at_return=abc"), "task.stop_at_return=abc: expected a number (or null); e.g. task.stop_at_return=475.0"),
    ((PPO, "task.update_epochs=2.5"), "task.update_epochs=2.5: expected a whole number; e.g. task.update_epochs=4"),
    ((PPO, "+task.clip_coeff=0.1"), "task.clip_coeff is not a setting of task=ppo; did you mean task.clip_coef?"),
    ((PPO, "device.precision=16-mixed"), "device.precision=16-mixed: task=ppo trains only in 32-true or 32; use device.precision=32-true"),
    (("experiment=dqn_cartpole", "device.precision=bf16-mixed"), "device.precision=bf16-mixed: task=dqn trains only in 32-true or 32; "
                                                                 "use device.precision=32-true"),
    (("experiment=dqn_cartpole", "env=pendulum"), "task=dqn takes discrete actions, and env.id=Pendulum-v1 has Box(-2.0, 2.0, (1,), "
                                                  "float32): choose another env, or task=ppo"),
    (("experiment=dqn_cartpole", "task.envs_per_agent=3"), "task.train_frequency=256: must be a multiple of task.envs_per_agent=3 "
                                                           "(env steps per agent between updates); e.g. task.train_frequency=768"),
    (("experiment=dqn_cartpole", "task.batch_size=512", "task.buffer_size=100"), "task.batch_size=512: is larger than task.buffer_size=100; "
                                                                                "e.g. task.batch_size=64"),
    (("experiment=dqn_cartpole", "task.eps_end=1.5"), "task.eps_end=1.5: must be a finite number in [0, 1]; e.g. task.eps_end=0.04"),
    (("experiment=cem_cartpole", "task.elite_percentile=101"), "task.elite_percentile=101: must be a finite number in [0, 100]; "
                                                               "e.g. task.elite_percentile=70.0"),
    ((PPO, "env.id=NoSuchEnv-v0"), "env.id=NoSuchEnv-v0 is not a registered gymnasium environment; e.g. env.id=CartPole-v1, "
                                   "or a shipped env: env=acrobot|"),
    ((PPO, "env.id=Cartpole-v1"), "env.id=Cartpole-v1 is not a registered gymnasium environment; did you mean env.id=CartPole-v1"),
    (("experiment=rmac_auction", "data.n_bidders=5000"), "data.n_bidders=5000: must be a whole number in [2, 100] (an auction "
                                                         "has 2 to 100 bidders here); e.g. data.n_bidders=2 or more"),
    (("experiment=rmac_auction", "data.value_scale=0"), "data.value_scale=0: must be a finite number > 0; e.g. data.value_scale=1.0"),
    (("experiment=rmac_auction", "+data.nbids=3"), "data.nbids is not a setting of data=auction_bids; did you mean data.n_bids?"),
    ((PPO, "+trainer.accumulate_grad_batchs=4"), "trainer.accumulate_grad_batchs is not a Lightning Trainer argument; "
                                                 "did you mean trainer.accumulate_grad_batches?"),
    ((PPO, "seeds_per_process=100000"), "seeds_per_process=100000: at most 4096 seeds train in one process"),
    ((PPO, "seed=4294967290", "seeds_per_process=16"), "seed=4294967290 seeds_per_process=16: the batch's seeds 4294967290..4294967305 "
                                                       "pass the largest seed 4294967295; e.g. seed=4294967280"),
])
def test_the_issues_bad_settings_are_one_line_naming_the_key(overrides, line):
    assert refusal(*overrides).startswith(line)


@pytest.mark.parametrize("overrides", [
    (PPO,), (PPO, "task.ent_coef=0", "task.stop_at_return=null", "task.max_grad_norm=null"),
    (PPO, "env=pendulum"), ("experiment=dqn_cartpole", "env=acrobot"), ("experiment=dqn_cartpole", "task.envs_per_agent=4"),
    ("experiment=cem_cartpole",), ("experiment=supervised_digits", "device.precision=bf16-mixed"),
    ("experiment=dqn_cartpole", "env.id=ALE/Pong-v5", "model=atari_cnn"), ("experiment=rmac_auction", "data.n_bidders=100", "data.grid=0"),
])
def test_valid_settings_pass(overrides):
    cfg, choices = composed(*overrides)
    checks.check_values(cfg, choices)


@pytest.mark.parametrize("preset", sorted(p.stem for p in (checks.conf_root() / "experiment").glob("*.yaml")))
def test_every_shipped_preset_passes_the_start_up_checks(preset):
    for overrides in ((f"experiment={preset}",), (f"experiment={preset}", "trainer=debug")):
        cfg, choices = composed(*overrides)
        checks.check_values(cfg, choices)


def test_an_env_gymnasium_cannot_make_here_is_left_to_the_task():
    assert env_ids.action_kind("CartPole-v1", {"no_such_kwarg": 1}) is None
    assert env_ids.action_kind("CartPole-v1")[0] == "discrete" and env_ids.action_kind("Pendulum-v1")[0] == "box"
    env_ids.check_env_id("gymnasium.envs.classic_control:CartPole-v1")  # gymnasium's `module:Id` form (module imported)


def test_an_envpool_backend_that_cannot_run_the_env_is_refused_by_the_start_up_checks():
    """env.backend=envpool with kwargs EnvPool has no counterpart for: one line from check_values (without envpool
    installed, the line names the install instead), before any env is made."""
    cfg, choices = composed(PPO, "env.backend=envpool", "+env.kwargs.foo=1")
    with pytest.raises(checks.ConfigError, match="envpool") as refused:
        checks.check_values(cfg, choices)
    assert "\n" not in str(refused.value)
    cfg, choices = composed(PPO, "+env.kwargs.foo=1")  # the gym backend is checked where its envs are made
    checks.check_values(cfg, choices)


def test_env_backends_are_checked_at_start_up_and_match_the_vector_envs():
    from pipeline.rl import vector

    assert set(env_ids.TENSOR_ENV_IDS) == set(vector.TENSOR_ENVS)
    with pytest.raises(ConfigError, match=r"^env.backend=foo: choose one of gym, tensor, envpool; e.g. env.backend=gym$"):
        checks.check_values(*composed(PPO, "env.backend=foo"))
    with pytest.raises(ConfigError, match=r"^env.backend=tensor has no tensor form of MountainCar-v0; tensor envs: "):
        checks.check_values(*composed(PPO, "env.id=MountainCar-v0", "env.backend=tensor"))
    checks.check_values(*composed(PPO, "env=cartpole_tensor"))
    with pytest.raises(ValueError, match="choose gym, tensor or envpool"):  # the builder agrees on the names
        vector.make_vector_env({"id": "CartPole-v1", "backend": "foo"}, [0], 1)
