"""What each task passes to a model's constructor and calls on the model: the contract any `nn.Module` meets to train.

Torch-free, so a start-up check can name a model's duties before anything is built; the tasks' own refusals of a
model that breaks it quote the same text. Shapes are one member's (the task runs K members as one stacked module:
`pipeline.nets.stacked`): N is the batch, `*obs_shape` the observation's shape as the env gives it (float32; uint8
for Atari frames), `in_features` its flat size.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelContract:
    """`constructor`: the keyword arguments the task passes (`model(**kwargs)`, beside the config's own `model.*`
    keys); `calls`: (name, what it takes, what it returns) for each method or submodule the task calls (what it takes
    empty: an attribute the task reads)."""

    task: str
    constructor: tuple[str, ...]
    calls: tuple[tuple[str, str, str], ...]

    def describe(self) -> str:
        """One line: how the task builds the model and what it calls on it."""
        calls = "; ".join(f"{name}({takes}) -> {returns}" if takes else f"{name}: {returns}" for name, takes, returns in self.calls)
        return f"model({', '.join(f'{k}=...' for k in self.constructor)}) with {calls}"


SUPERVISED = ModelContract(
    "supervised", ("in_features", "out_features"),
    (("forward", "x [N, in_features]", "[N, out_features] (out_features: the classes, 1 for a regression loss)"),),
)
DQN = ModelContract(
    "dqn", ("in_features", "out_features"),
    (("forward", "obs [N, *obs_shape]", "Q-values [N, out_features] (out_features: the actions)"),),
)
CEM = ModelContract(
    "cem", ("in_features", "out_features"),
    (("forward", "obs [N, *obs_shape]", "action logits [N, out_features] (out_features: the actions)"),),
)
PPO = ModelContract(
    "ppo", ("in_features", "out_features", "continuous"),
    (("forward", "obs [N, *obs_shape]",
      "(policy parameters [N, out_features], value [N]): logits over out_features actions, or a Gaussian's mean over "
      "out_features action dimensions when continuous=True, whose log-std is the parameter log_std.value "
      "[out_features] (pipeline.nets.actor_critic.LogStd)"),),
)
SAC = ModelContract(
    "sac", ("in_features", "out_features", "action_low", "action_high"),
    (("distribution", "obs [N, *obs_shape]", "(mean [N, out_features], log_std [N, out_features]) of the Gaussian tanh squashes"),
     ("bounds", "actions in [-1, 1] [N, out_features]", "the same in the env's units (pipeline.nets.continuous_control.ActionBounds)"),
     ("forward", "obs [N, *obs_shape]", "the deterministic action in the env's units [N, out_features]")),
)
TD3 = ModelContract(
    "td3", ("in_features", "out_features", "action_low", "action_high"),
    (("unit", "obs [N, *obs_shape]", "actions in [-1, 1] [N, out_features]"),
     ("bounds", "actions in [-1, 1] [N, out_features]", "the same in the env's units (pipeline.nets.continuous_control.ActionBounds)"),
     ("forward", "obs [N, *obs_shape]", "the deterministic action in the env's units [N, out_features]")),
)
GAN = ModelContract(
    "gan", ("image_shape",),
    (("generator", "noise [N, latent_dim]", "images [N, *image_shape] in [-1, 1]"),
     ("discriminator", "images [N, *image_shape]", "logits [N]"),
     ("latent_dim", "", "the noise size (an int attribute)")),
)

BY_TASK = {c.task: c for c in (SUPERVISED, DQN, CEM, PPO, SAC, TD3, GAN)}
