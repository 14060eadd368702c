"""The one check of a run before it starts: `check_run(cfg) -> CheckedRun`.

Everything a run can know before it builds anything is checked here, once per process: missing values, types
against the shipped defaults, values and cross-field rules of the typed task and data Configs (`checks`,
`task_settings`: one merge of the `task:` node into its Config), the groups the task uses, seeds and
`seeds_per_process`, processes, callbacks and what they monitor, precision, the env and its action space, and a
model of the user's own against the contract of the task (`pipeline.nets.contracts`). The CLI, a sweep's `-m`
start-up checks, a sweep job, the tuner and `pipeline.run` call it; the lifecycle (`pipeline.runtime.run`) takes
the `CheckedRun` it returns and checks nothing.

It raises `ConfigError` (one line: the key, what is wrong, the fix) and never prints or exits. Torch-free for the
shipped tasks and models: a task of the user's own is imported once (its class holds its Config), and a model of the
user's own once (its constructor against what the task passes).

A preset's `model:` keys belong to the model option it picks: when the command line chooses another option, the
model node is that option's own YAML plus the user's own `model.*` overrides (`own_model_node`), never the preset's
keys merged into a model that does not take them.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.config import checks
from pipeline.config.conf_tree import group_options
from pipeline.config.env_ids import carry_env_imports
from pipeline.config.errors import ConfigError
from pipeline.config.task_settings import config_class, declared, shipped_tasks, task_name

# The groups a task can take (pipeline.tasks.base.PART_GROUPS' keys): one it does not declare in `uses` must be empty.
PART_GROUPS = ("model", "loss", "optimizer", "scheduler", "env", "data")
# Keys of a model node that instantiate reads, not the constructor.
INSTANTIATE_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")
TASK_BASE = "pipeline.tasks.base.Task"
MODULE_BASE = "torch.nn.modules.module.Module"


@dataclass(frozen=True)
class DeviceSettings:
    """The `device:` group, typed (conf/device/*.yaml says what each key does)."""

    accelerator: str = "auto"
    precision: str = "32-true"
    num_threads: int | None = 1
    flush_denormal: bool = True
    cpu_heap_mb: int | None = None
    compile: bool = False
    deterministic: bool = False  # seeding.deterministic


@dataclass(frozen=True)
class CheckpointSettings:
    """The `checkpoint:` node, typed: periodic checkpoints every `every_s` seconds or `every_steps` steps."""

    enabled: bool = True
    every_s: float | None = 60.0
    every_steps: int | None = None


@dataclass(frozen=True, eq=False)
class CheckedRun:
    """A composed config that passed every start-up check, and what the run reads from it, typed."""

    cfg: DictConfig  # the job's config (no `hydra` node): a removed optional group filled, a preset's foreign model keys dropped
    choices: Mapping[str, str]  # the option chosen in each group ({} outside Hydra)
    task_target: str  # task._target_, the task class the run builds
    task: Any  # the `task:` node as the task's typed Config
    uses: frozenset[str]  # the groups the task takes (its Config's `uses`)
    seeds: tuple[int, ...]  # seed, seed + 1, ..., seed + K - 1 (K = seeds_per_process)
    processes: int  # how many processes one run spans (trainer=ddp), else 1
    device: DeviceSettings = field(default_factory=DeviceSettings)
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    data: Any = None  # the `data:` node as its typed Config, where one is declared (pipeline.config.data_settings)
    trains_seeds_together: bool = False

    @property
    def seed(self) -> int:
        return self.seeds[0]

    @property
    def k(self) -> int:
        return len(self.seeds)

    def task_class(self) -> type:
        """The task's class (imports it: torch and Lightning for a shipped task)."""
        return import_task_class(self.task_target)


def check_run(cfg: DictConfig, choices: Mapping[str, str | None] | None = None) -> CheckedRun:
    """Check `cfg` (as composed; a `hydra` node, or the running Hydra app, tells the options chosen and the command
    line) and return it typed; `ConfigError` names the first problem. `cfg` itself is not changed. `choices`
    given: the options chosen (a job's own process, outside Hydra); the running Hydra app is then not asked."""
    hydra = _hydra_node(cfg, ask_app=choices is None)
    cfg = copy.deepcopy(cfg)
    if "hydra" in cfg:
        with open_dict(cfg):
            del cfg["hydra"]
    if choices is None:
        choices = {} if hydra is None else _choices(hydra)
    choices = {str(k): (None if v is None else str(v)) for k, v in choices.items()}
    checks.check_missing(cfg)
    own = own_model_node(cfg, hydra, choices)
    if own is not None:
        with open_dict(cfg):
            cfg.model = own
    checks.check_types(cfg, choices)
    target = str(OmegaConf.select(cfg, "task._target_", default="") or "")
    config_cls = _task_config_class(target)
    name = task_name(config_cls, choices) if choices.get("task") or config_class(target) else target.rsplit(".", 1)[-1]
    k = int(cfg.get("seeds_per_process") or 1)
    try:
        task, data = checks.check_values(cfg, choices, config_cls)
        _check_declarations(cfg, config_cls, name, k)
        checks.check_monitors(cfg, config_cls)
        _check_model(cfg, config_cls, name, choices)
    except OSError as exc:  # a native library that does not load (MuJoCo without its GL library): one line, not 38
        raise ConfigError(_unloadable_line(cfg, exc)) from None
    carry_env_imports(cfg)  # an env this process's imports registered: its module goes into the config that runs
    return CheckedRun(
        cfg=cfg, choices={g: o for g, o in choices.items() if o is not None}, task_target=target, task=task,
        uses=frozenset(declared(config_cls, "uses")), seeds=tuple(int(cfg.seed) + i for i in range(k)),
        processes=checks.process_count(cfg), device=_device(cfg), checkpoint=_checkpoint(cfg), data=data,
        trains_seeds_together=bool(declared(config_cls, "trains_seeds_together")),
    )


# ---- the task: its class and Config --------------------------------------------------------------------------
def import_task_class(target: str) -> type:
    """The class `task._target_` names; it must be a `pipeline.tasks.base.Task` (one line otherwise)."""
    try:
        cls = locate(target)
    except Exception as exc:  # noqa: BLE001 - any import problem is the same one-line refusal
        raise ConfigError(f"task._target_={target}: {checks.one_line(exc)}") from None
    # By name: the Task base imports Lightning, which a check of a shipped task never loads.
    if not (isinstance(cls, type) and any(_qualified(c) == TASK_BASE for c in cls.__mro__)):
        raise ConfigError(f"task._target_={target} is not a {TASK_BASE} subclass")
    return cls


def _task_config_class(target: str) -> type:
    """The task's typed Config: a shipped task's from its torch-free schema, a task of the user's own from its class
    (imported once, here)."""
    shipped = config_class(target)
    if shipped is not None:
        return shipped
    cls = import_task_class(target)
    config = cls.Config
    if not dataclasses.is_dataclass(config):
        raise ConfigError(f"{cls.__name__}.Config is not a dataclass: a task's hyperparameters are one (docs/add_an_algorithm.md)")
    for name in ("uses", "trains_seeds_together", "monitorable_metrics"):
        if name in vars(cls) and name not in dir(config):
            raise ConfigError(f"{cls.__name__}.{name}: a task declares it on its Config; move it to "
                              f"{config.__name__}.{name} (docs/add_an_algorithm.md)")
    return config


def _check_declarations(cfg: DictConfig, config_cls: type, name: str, k: int) -> None:
    """What the task's Config declares against what the config asks: seeds trained together, the groups it takes."""
    task = name if name.startswith("task=") else f"task {name}"
    if k > 1 and not declared(config_cls, "trains_seeds_together"):
        together = [option for option, cls in shipped_tasks().items() if declared(cls, "trains_seeds_together")]
        raise ConfigError(
            f"{task} trains one seed per process; seeds_per_process={k} works with task={', '.join(together[:-1])} and "
            f"{together[-1]} (run the seeds as a sweep: -m seed='range(0,N)')"
        )
    uses = declared(config_cls, "uses")
    for group in PART_GROUPS:
        node = cfg.get(group)
        if group != "data" and group not in uses and not _is_empty(node):
            shown = node.get("_target_") if isinstance(node, DictConfig) else None
            raise ConfigError(f"{task} does not use a {group}; drop it with {group}=none (got {group}={shown or node})")


# ---- the model: a preset's keys, and the contract of a model of the user's own ---------------------------------
def own_model_node(cfg: DictConfig, hydra: DictConfig | None, choices: Mapping[str, str | None]) -> DictConfig | None:
    """The model node when the command line chooses a model option other than the preset's: that option's own YAML
    plus the user's own `model.*` overrides (a preset's `model.hidden` is no key of a user's ResMLP). None: the node
    stands as composed (no preset, no model option typed, the preset's own option, or no Hydra to compose with)."""
    if hydra is None or not choices.get("experiment") or not choices.get("model"):
        return None
    typed = [str(o) for o in OmegaConf.select(hydra, "overrides.task", default=None) or []]
    chosen = [o for o in typed if _override_key(o) == "model"]
    if not chosen:
        return None
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra

    if not GlobalHydra.instance().is_initialized():
        return None
    searchpath = [str(o) for o in OmegaConf.select(hydra, "overrides.hydra", default=None) or []
                  if _override_key(str(o)) == "hydra.searchpath"]
    rest = [o for o in typed if _override_key(o) != "model" and not _override_key(o).startswith("model.")]
    try:
        preset = compose(config_name="config", overrides=[*rest, *searchpath], return_hydra_config=True)
        if OmegaConf.select(preset, "hydra.runtime.choices.model") == choices["model"]:
            return None
        own = compose(config_name="config", overrides=[*chosen, *searchpath]).get("model")
    except Exception:  # noqa: BLE001 - composed once already; the model's contract check names what does not fit
        return None
    user_keys = {_override_key(o).split(".")[1] for o in typed if _override_key(o).startswith("model.")}
    composed = OmegaConf.to_container(cfg.model, resolve=False) if isinstance(cfg.get("model"), DictConfig) else {}
    alone = OmegaConf.to_container(own, resolve=False) if isinstance(own, DictConfig) else {}
    node = {k: (v if k in user_keys else alone[k]) for k, v in composed.items() if k in user_keys or k in alone}
    return OmegaConf.create(node)


def _check_model(cfg: DictConfig, config_cls: type, name: str, choices: Mapping[str, str | None]) -> None:
    """The model against the task's contract (its Config's `model_contract`): a task that builds a model needs one;
    a model of the user's own (a `_target_` outside this package) must import, be an `nn.Module` (a class) and take
    what the task passes, without being built. What forward returns is checked when the task builds it."""
    contract = declared(config_cls, "model_contract")
    if contract is None or "model" not in declared(config_cls, "uses"):
        return
    node = cfg.get("model")
    option = f"model={choices['model']}" if choices.get("model") else "model"
    if _is_empty(node):
        options = "|".join(o for o in group_options().get("model", []) if o != "none")
        raise ConfigError(f"{option}: {name} builds its network from the model group; choose one with model={options}")
    target = str(node.get("_target_") or "")
    if not target or target.startswith("pipeline."):
        return  # a shipped network: the task checks it against what it builds (our classes, our contracts)
    duty = f"{name} builds it as {contract.describe()}"
    try:
        built = locate(target)
    except Exception as exc:  # noqa: BLE001 - a module that does not import, a name it lacks: one line
        raise ConfigError(f"model._target_={target} cannot be imported ({checks.one_line(exc)}); {duty}") from None
    if isinstance(built, type) and not any(_qualified(c) == MODULE_BASE for c in built.__mro__):
        raise ConfigError(f"model._target_={target} is not a torch.nn.Module subclass; {duty}")
    if not node.get("_partial_", False):
        raise ConfigError(f"{option} ({target}) needs _partial_: true in its YAML (the task calls it with the sizes only "
                          f"it knows); {duty}")
    try:
        signature = inspect.signature(built)
    except (TypeError, ValueError):
        return  # a builtin or C extension without a signature: left to the build
    given = {k: None for k in node if k not in INSTANTIATE_KEYS}
    passed = {k: None for k in contract.constructor}
    try:
        signature.bind(*list(node.get("_args_") or []), **{**given, **passed})
    except TypeError as exc:
        clash = sorted(set(given) - {p for p in signature.parameters})
        has_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
        why = (f"its keys {', '.join(f'model.{k}' for k in clash)} are no argument of {target}" if clash and not has_kwargs
               else f"{target}{signature}: {exc}")
        raise ConfigError(f"{option} does not fit {name}: {why}; {duty}") from None


def model_contracts_help() -> str:
    """What each shipped task passes to its model and calls on it: `python -m pipeline --help` prints it."""
    lines = ["Models: model=<option>, or one of your own (a YAML in <your config dir>/model/ with _target_ and "
             "_partial_: true, given with 'hydra.searchpath=[file://<dir>]' model=<name>). Each task builds it as:"]
    for option, cls in shipped_tasks().items():
        contract = declared(cls, "model_contract")
        if contract is not None:
            lines.append(f"  task={option}: {contract.describe()}")
    return "\n".join(lines)


# ---- helpers ----------------------------------------------------------------------------------------------------
def locate(path: str) -> Any:
    """The object a dotted `_target_` names, imported as Hydra's `instantiate` would (without Hydra's error log: the
    refusal is one line). A module that fails inside its own imports says so, not that the path is unknown."""
    parts, missing = path.split("."), None
    for i in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")) and i > 1:
                missing = missing or exc  # a shorter prefix may be the module, the rest attributes
                continue
            raise
        for j, attr in enumerate(parts[i:], start=i):
            if not hasattr(obj, attr):
                raise missing if missing is not None and j == i else ImportError(f"{'.'.join(parts[:j])} has no {attr!r}")
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"{path!r} is not a dotted path (module.Name)")


def _hydra_node(cfg: DictConfig, ask_app: bool) -> DictConfig | None:
    """The config's own `hydra` node (composed with return_hydra_config=True), else the running Hydra app's."""
    node = cfg.get("hydra") if isinstance(cfg, DictConfig) else None
    if isinstance(node, DictConfig) and OmegaConf.select(node, "runtime.choices", default=None) is not None:
        return node
    if not ask_app:
        return None
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def _choices(hydra: DictConfig) -> dict[str, str | None]:
    node = OmegaConf.select(hydra, "runtime.choices", default=None) or {}
    return {str(k): (None if v is None else str(v)) for k, v in node.items()}


def _override_key(override: str) -> str:
    """`+model.width=3` -> `model.width`; `override model=x` -> `model`; `~model.hidden` -> `model.hidden`."""
    key = override.split("=", 1)[0].strip().removeprefix("override ").strip()
    return key.lstrip("+~").strip()


def _unloadable_line(cfg: DictConfig, exc: OSError) -> str:
    """What failed to load while the config was checked (the package of the innermost frame), and for which env."""
    import traceback

    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    package = str(frames[-1].f_globals.get("__name__", "")).split(".")[0] if frames else ""
    env_id = OmegaConf.select(cfg, "env.id", default=None)
    where = f"env.id={env_id}" if env_id else "the config's check"
    what = f"the {package} package is installed but cannot be loaded" if package else "a library cannot be loaded"
    return f"{where}: {what} ({checks.one_line(exc)[:200]}); repair its installation, or choose another env"


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_empty(node) -> bool:
    return node is None or (isinstance(node, DictConfig) and len(node) == 0)


def _device(cfg: DictConfig) -> DeviceSettings:
    device = cfg.get("device") or {}
    threads, heap = device.get("num_threads"), device.get("cpu_heap_mb")
    return DeviceSettings(
        accelerator=str(device.get("accelerator") or "auto"), precision=str(device.get("precision") or "32-true"),
        num_threads=None if threads is None else int(threads), flush_denormal=bool(device.get("flush_denormal", True)),
        cpu_heap_mb=None if heap is None else int(heap), compile=bool(device.get("compile", False)),
        deterministic=bool(OmegaConf.select(cfg, "seeding.deterministic", default=False)),
    )


def _checkpoint(cfg: DictConfig) -> CheckpointSettings:
    spec = cfg.get("checkpoint") or {}
    every_s, every_steps = spec.get("every_s"), spec.get("every_steps")
    return CheckpointSettings(enabled=bool(spec.get("enabled", True)),
                              every_s=None if every_s is None else float(every_s),
                              every_steps=None if not every_steps else int(every_steps))
