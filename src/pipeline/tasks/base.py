"""The task contract: everything the lifecycle (`pipeline.runtime.run`) asks of a task, declared in one place.

A task is a LightningModule (or behaves like one where Lightning has nothing to add). The lifecycle
builds it as `TaskClass(config, parts)`:

- `config` is an instance of the task's own `Config` dataclass (its hyperparameters, one typed field
  each): the start-up check (`pipeline.config.startup.check_run`) merges the `task:` node of the composed
  config into it once, so a wrong type or an unknown key is one line before any work starts;
- `parts` (`TaskParts`) are the objects built from the other config groups (`model`, `loss`,
  `optimizer`, `scheduler`, `env`, `data`) plus the seed, the number of seeds trained together and
  where the run lives.

What a task declares for start-up (the groups it takes, whether K seeds train together, the metrics a callback
may monitor, precisions, action spaces, its model contract) lives on its torch-free `Config` as class variables
(`pipeline.tasks.configs` lists them), so the start-up check reads them without importing the task.

Then the lifecycle only ever touches what this class declares, in this order:

1. `load_checkpoint_state(state)` (resuming only): take a checkpoint's state, return its step;
2. `curves`, `checkpoint_hook`, `trial_reporter` are set (see each one below);
3. `fit_and_evaluate(trainer, datamodule, ckpt_path)`: train, then one dict of final metrics per agent;
4. `agent_state_dict(i)` -> `model.pt` (`agent_files(i)` beside it), `agent_record(i)` -> extra record fields,
   `time_breakdown_s`;
5. `resume_step` when a stop request ended the fit (the step the record says it reached).

`python -m pipeline.eval` builds the task the same way (one agent, the run's seed) and, for a task with
`eval_splits`, calls `load_agent_state_dict(model.pt)` then `evaluate_model(datamodule, split)`.

Every hook has a default here, so a new algorithm overrides only what it does differently.
`docs/add_an_algorithm.md` walks through one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

import lightning as L
import torch
from torch import nn


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss; the run stops and is recorded as failed."""


def check_finite(loss: torch.Tensor, step: int, hint: str = "lower the learning rate or clip gradients") -> None:
    if not torch.isfinite(loss).all():
        value = loss.detach().float().mean().item()
        raise NonFiniteLossError(f"loss became {value} at step {step}; {hint}")


@dataclass
class NoConfig:
    """The hyperparameters of a task that has none (its YAML holds only `_target_`)."""


# The config groups a task can take; what each becomes in `TaskParts`.
PART_GROUPS = {"model": "net", "loss": "loss", "optimizer": "optimizer", "scheduler": "scheduler", "env": "env", "data": "datamodule"}


@dataclass
class TaskParts:
    """What the lifecycle builds from the config groups and hands to the task (None: the group is `none`).

    Built by `hydra.utils.instantiate` from the group's node: a `_partial_: true` node (model, optimizer,
    scheduler) arrives as a factory that the task calls with the sizes only it knows.
    """

    seed: int = 0
    # Seeds trained together in this process (`seeds_per_process`); > 1 only for tasks with trains_seeds_together.
    n_agents: int = 1
    # model: a factory; plain networks take `in_features=` and `out_features=` (`pipeline.nets.factory.make_net`),
    # GAN pairs `image_shape=`.
    net: Callable[..., nn.Module] | None = None
    loss: nn.Module | None = None
    # optimizer: a factory taking the parameters; scheduler: a factory taking the optimizer.
    optimizer: Callable[..., torch.optim.Optimizer] | None = None
    scheduler: Callable[..., Any] | None = None
    # env: the env group as a plain dict ({"id": ..., "kwargs": {...}, ...}).
    env: dict | None = None
    # data: the LightningDataModule, already set up for "fit" (it carries in_features, n_classes, image_shape).
    datamodule: L.LightningDataModule | None = None
    # Where the run writes (the task may put extra files there: sample grids, plots), and the compute device.
    run_dir: Path | None = None
    device: torch.device | None = None

    def require(self, part: str, task: str, fix: str) -> Any:
        """The part, or a one-line error naming the config group that must provide it."""
        value = getattr(self, part)
        if value is None:
            raise ValueError(f"task={task} needs {part}: {fix}")
        return value


class Progress(NamedTuple):
    """What the training progress bar shows: `done` of `total` in `unit`, and the latest values beside it."""

    done: int
    total: int
    unit: str
    shown: dict[str, float]


class Task(L.LightningModule):
    """The base of every task. Class attributes are the declarations; methods are the hooks, with their defaults."""

    # ---- declarations (class attributes) --------------------------------------------------------------
    #: The hyperparameters: a dataclass whose fields are the keys of the task's YAML (besides `_target_`).
    Config: ClassVar[type] = NoConfig
    #: With several processes (trainer=ddp): some parameters get no gradient in a backward pass (a GAN's two
    #: alternating updates), so DDP must look for them (`find_unused_parameters`, a graph walk per backward).
    ddp_unused_parameters: ClassVar[bool] = False
    #: True: the task writes its own curves through `self.curves` (one CurveLog per agent);
    #: False: the lifecycle gives Lightning a logger that writes metrics.csv from `self.log`.
    writes_curves: ClassVar[bool] = False
    #: "lightning": Lightning's checkpoints (saved at epoch ends, resumed by `trainer.fit(ckpt_path=...)`);
    #: "state": the task's own `checkpoint_state()`, saved whenever it calls `self.checkpoint_hook()`.
    checkpointing: ClassVar[Literal["lightning", "state"]] = "lightning"
    #: The key of the final metrics that sweeps and reports compare (e.g. `test/acc`); may be set per instance.
    primary_metric: str = ""
    #: The metrics.csv column drawn as the learning curve (None: no curve).
    primary_curve: str | None = None
    higher_is_better: bool = True
    #: After a run ends ok, the lifecycle records one greedy episode of each agent as an MP4 (RL tasks).
    capture_video: bool = False
    #: The data splits `python -m pipeline.eval` can score a saved model.pt on, the default first (it calls
    #: `load_agent_state_dict` then `evaluate_model`). Empty: it cannot (RL agents are replayed in their env instead).
    eval_splits: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Any = None, parts: TaskParts | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else self.Config()
        parts = parts if parts is not None else TaskParts()
        self.seed = int(parts.seed)
        self.n_agents = int(parts.n_agents)  # the start-up check refuses seeds_per_process < 1 before a task is built
        self.agent_seeds = [self.seed + i for i in range(self.n_agents)]
        #: Where the time went ({"train": s, "eval": s, ...}), filled in while running; goes to the record.
        self.time_breakdown_s: dict[str, float] = {}
        # ---- set by the lifecycle before fit_and_evaluate -----------------------------------------------
        #: writes_curves tasks: one CurveLog (metrics.csv) per agent; log rows with `curves[i].log(step, row)`.
        self.curves: list = []
        #: One list of Lightning loggers (TensorBoard / W&B) per agent, agent i's writing to its seed's run dir
        #: (with one agent: the trainer's loggers); log agent i's rows with `agent_loggers[i][j].log_metrics`.
        self.agent_loggers: list[list] = []
        #: `device.compile`: True asks the task to run its update through `torch.compile` (the RL tasks; the others train eagerly).
        self.compile_updates: bool = False
        #: checkpointing="state" tasks: call `checkpoint_hook()` at safe points (it saves when due and stops the
        #: fit when a stop was requested) and `checkpoint_hook(final=True)` when training ends.
        self.checkpoint_hook: Callable[..., None] | None = None
        #: Set when the run is an Optuna trial: `trial_reporter.report(step, values)` -> True when pruned.
        self.trial_reporter = None
        #: RL tasks: `video_hook(agent, step, state_dict, files)` records one greedy episode of agent `agent`'s policy
        #: (the plain network's state_dict, and its `agent_files`) as an MP4 and logs it to TensorBoard / W&B at `step`.
        self.video_hook: Callable[[int, int, dict, dict], None] | None = None

    @classmethod
    def create(cls, **values: Any) -> Task:
        """Build by hand (notebooks, tests): keywords that name a TaskParts field are parts, the rest the Config's fields.

        `DQNTask.create(net=..., loss=..., optimizer=..., env={"id": "CartPole-v1"}, n_agents=2, gamma=0.9)`.
        """
        part_names = {f.name for f in fields(TaskParts)}
        parts = TaskParts(**{k: v for k, v in values.items() if k in part_names})
        return cls(cls.Config(**{k: v for k, v in values.items() if k not in part_names}), parts)

    def add_time(self, phase: str, seconds: float) -> None:
        self.time_breakdown_s[phase] = self.time_breakdown_s.get(phase, 0.0) + float(seconds)

    def safe_point(self, final: bool = False) -> None:
        """checkpointing="state" tasks: call between iterations (`final=True` once training ends); the lifecycle's
        `checkpoint_hook` saves when due and stops the fit when a stop was requested. Nothing when none is set."""
        if self.checkpoint_hook is not None:
            self.checkpoint_hook(final=final)

    # ---- the hooks the lifecycle calls ------------------------------------------------------------------
    def fit_and_evaluate(self, trainer: L.Trainer, datamodule, ckpt_path: str | None) -> list[dict[str, float]]:
        """Train, then return the final metrics of each agent (one dict per agent, keys `split/name`).

        `ckpt_path` is the checkpoint to resume from for checkpointing="lightning" tasks (None otherwise).
        Default, for supervised-style tasks: fit with validation, then test; the final metrics are the test ones.
        """
        t0 = time.perf_counter()
        trainer.fit(self, datamodule=datamodule, ckpt_path=ckpt_path)
        self.add_time("fit", time.perf_counter() - t0)
        t0 = time.perf_counter()
        results = trainer.test(self, datamodule=datamodule, verbose=False)
        self.add_time("test", time.perf_counter() - t0)
        return [scalar_metrics(results[0] if results else {})]

    def agent_record(self, i: int) -> dict:
        """Extra top-level fields for agent i's result.json (RL: env_steps, time_to_threshold_s, ...).

        Also called on a failed or interrupted run (whatever the task knows so far), so it must not assume
        training finished.
        """
        return {}

    def agent_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Agent i's trained weights, written to its model.pt (loadable with weights_only=True).

        Default: the `net` attribute's state_dict (the task itself when it has none), for one agent.
        """
        net = self.net if isinstance(getattr(self, "net", None), nn.Module) else self
        return {k: v.detach().cpu() for k, v in net.state_dict().items()}

    def agent_files(self, i: int) -> dict[str, dict[str, torch.Tensor]]:
        """What agent i's policy needs besides its weights, as files beside its model.pt: {file name: a state dict
        of CPU tensors} (PPO: `obs_norm.pt`, the observation statistics, when it normalises them). Default: none."""
        return {}

    def load_agent_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Agent 0 from a model.pt (the inverse of `agent_state_dict`); weights that do not fit raise.

        Default: into the `net` attribute (the task itself when it has none), as `agent_state_dict` reads it.
        """
        net = self.net if isinstance(getattr(self, "net", None), nn.Module) else self
        net.load_state_dict(state_dict)

    def evaluate_model(self, datamodule, split: str, seed: int | None = None) -> dict[str, float]:
        """Tasks with `eval_splits`: score agent 0 as loaded on `split` (one of `eval_splits`) of `datamodule`, without
        training or a Trainer. The keys are `fit_and_evaluate`'s, and so are the values for the run's own model.pt and
        data. `seed`: the seed of any randomness the score draws (None: the stream the run's own score used)."""
        raise TypeError(f"{type(self).__name__} declares no eval_splits: python -m pipeline.eval cannot score it")

    def __init_subclass__(cls, **kwargs) -> None:
        """A task that keeps its own state must say how to save and restore it: refused when the class is made.
        So must a task that declares `eval_splits` say how it scores them."""
        super().__init_subclass__(**kwargs)
        if cls.checkpointing == "state" and (cls.checkpoint_state is Task.checkpoint_state
                                             or cls.load_checkpoint_state is Task.load_checkpoint_state):
            raise TypeError(f"{cls.__name__} declares checkpointing='state': define checkpoint_state and load_checkpoint_state")
        if cls.eval_splits and cls.evaluate_model is Task.evaluate_model:
            raise TypeError(f"{cls.__name__} declares eval_splits: define evaluate_model")

    def checkpoint_state(self) -> dict:
        """checkpointing="state" tasks: everything needed to continue in distribution, as plain values."""
        raise TypeError(f"{type(self).__name__} declares checkpointing={self.checkpointing!r} without checkpoint_state")

    def load_checkpoint_state(self, state: dict) -> int:
        """Take a loaded checkpoint before fit; return the step it holds (metrics.csv keeps rows up to it).

        Default (checkpointing="lightning"): Lightning restores weights and loops in `trainer.fit(ckpt_path=...)`;
        here only the epoch is read.
        """
        return int(state.get("epoch", 0))

    def progress(self) -> Progress | None:
        """For a task whose budget is not epochs x batches (RL: env steps against task.total_steps, with the last
        episode return and evaluation beside it): what the training progress bar counts. None: Lightning's bar."""
        return None

    @property
    def resume_step(self) -> int | None:
        """The step a stopped run reached (its checkpoint's step); None where the task does not count steps itself."""
        return None


def scalar_metrics(values: Mapping) -> dict[str, float]:
    out = {}
    for key, value in values.items():
        value = value.item() if hasattr(value, "item") else value
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[str(key)] = float(value) if math.isfinite(float(value)) else float("nan")
    return out

