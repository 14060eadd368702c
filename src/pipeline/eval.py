"""Evaluate a trained run from its `model.pt`: `python -m pipeline.eval <run dir> [options]`.

Loads `<run dir>/model.pt` (weights only) into the network the run's own config describes and writes
`<run dir>/eval.json`. A seed of a seed-batched run is `<batch dir>/seed<n>` (its config is the batch's).
`weights=best` evaluates the best-evaluated weights an RL run kept instead (`best.pt`, task.keep_best=true;
a run without them is one line saying why); eval.json's `weights` says which.

- An RL run (DQN, PPO, SAC, TD3, CEM: its config has an env) plays `episodes=N` (10) episodes of the
  deterministic act of the policy its task declares (`pipeline.rl.policies`, as its evaluations played) on fresh
  start states (seeds the run never trained or was scored on; `seed=S`: the first episode's), with `video=true`
  an MP4 per episode under `<run dir>/videos/`; eval.json holds per-episode returns and lengths, mean, std,
  seeds. When the run logged to W&B or TensorBoard, the replay goes there too.
- A supervised run is scored on `split=test` (default), `val` or `train` of its own data, with the task's
  own metric code and no Trainer: eval.json's `metrics` has the names the run's record uses (`test/acc`,
  `test/loss`, ...) and, on the run's data and split, the run's own numbers. `data.<key>=<value>` changes
  the run's `data:` node first (e.g. `data.split_seed=1`; a key its data module lacks is refused, naming
  those it has).
- A GAN run's generator is scored by the run's own judge (the classifier, or frame features) against the
  real test split: `eval/inception_score`, ... as in the record, equal to the run's final score (the same
  noise); `seed=S` draws other noise.

`out=<dir>` writes eval.json there instead (a run dir that cannot be written: a read-only copy, another user's runs).

No Lightning for an RL replay: its record names its policy (a record made before records named it: the run's task
class is imported to find it), so it starts in about the time torch and gymnasium take to import.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

from pipeline.runtime.replay import EvalError, Options, find_config, has_env, log_to_run_loggers, play
from pipeline.store.layout import BEST, EVAL_FILE, MODEL
from pipeline.store.record import write_json

USAGE = ("usage: python -m pipeline.eval <run dir> [device=cpu] [out=<dir for eval.json>]  "
         "RL (DQN, PPO, SAC, TD3, CEM): [episodes=10] [video=false] [seed=<first episode>] [weights=model|best]  "
         "supervised: [split=test|val|train] [data.<key>=<value>]  GAN: [seed=<noise seed>] [data.<key>=<value>]")


def _device(requested: str) -> str:
    """cpu, cuda, cuda:N, mps or auto, checked now: a device the machine lacks is one line, not a torch traceback."""
    from pipeline.runtime.devices import DeviceError, resolve_accelerator

    kind, _, index = requested.lower().partition(":")
    if kind not in ("cpu", "cuda", "gpu", "mps", "auto") or (index and not index.isdigit()):
        raise EvalError(f"device={requested}: choose cpu, cuda, cuda:<n>, mps or auto")
    try:
        resolved = resolve_accelerator(kind)
    except DeviceError as exc:
        raise EvalError(str(exc)) from None
    return f"{resolved}:{index}" if index else resolved


def parse_args(argv: list[str]) -> Options:
    # A run dir may hold "=" (a sweep job's dir is named after its overrides): an existing dir is the run dir.
    paths = [a for a in argv if "=" not in a or Path(a).is_dir()]
    if len(paths) != 1:
        raise EvalError(f"expected one run dir, got {len(paths)}; {USAGE}")
    options = Options(run_dir=Path(paths[0]))
    for item in (a for a in argv if a not in paths):
        key, value = item.split("=", 1)
        options.given.add(key.split(".")[0])
        try:
            if key.startswith("data.") and len(key) > len("data."):
                options.data[key[len("data."):]] = value
            elif key == "split":
                if not value:
                    raise EvalError(f"split= needs a value: test, val or train; {USAGE}")
                options.split = value
            elif key == "episodes":
                options.episodes = int(value)
                if options.episodes < 1:
                    raise ValueError
            elif key == "video":
                if value.lower() not in ("true", "false"):
                    raise ValueError
                options.video = value.lower() == "true"
            elif key == "device":
                options.device = _device(value)
            elif key == "seed":
                options.seed = int(value)
                if options.seed < 0:
                    raise ValueError
            else:
                raise EvalError(f"unknown option {key!r}; {USAGE}")
        except ValueError as exc:
            if isinstance(exc, EvalError):
                raise
            raise EvalError(f"{item}: expected {'true or false' if key == 'video' else 'a whole number >= 0 (>= 1 for episodes)'}") from None
    return options


def writable(folder: Path) -> bool:
    """Whether a file can be made in `folder` (absent: in its nearest existing parent, where it would be made)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def check_writable(options: Options, out: Path | None) -> Path:
    """Where eval.json goes, refused before any work when it cannot be written there (one line with the fix)."""
    target = Path(out) if out is not None else options.run_dir
    if options.run_dir.is_dir() and not writable(target):
        fix = "choose a folder you can write" if out is not None else "write it elsewhere with out=<dir>"
        raise EvalError(f"cannot write {target / EVAL_FILE}: the folder is not writable; {fix}")
    if options.video and options.run_dir.is_dir() and not writable(options.run_dir):
        raise EvalError(f"video=true writes its MP4s into {options.run_dir / 'videos'}, which is not writable; "
                        "run without video=true (and with out=<dir>), or on a writable copy of the run dir")
    return target


def best_weights(cfg, run_dir: Path, fix: str = "load weights='model'") -> dict:
    """best.pt's state_dict, or one line saying why there is none to load, ending with `fix`."""
    from omegaconf import OmegaConf

    from pipeline.runtime.replay import policy_class, task_settings
    from pipeline.store.checkpoint import CheckpointError, load_safely
    from pipeline.store.layout import best_path

    path = best_path(run_dir)
    if not path.is_file():
        asked = OmegaConf.select(cfg, "task.keep_best", default=None)
        why = ("it ran without task.keep_best=true" if asked is False else
               "it has no evaluation yet" if asked else "only RL runs keep their best-evaluated weights")
        raise EvalError(f"{path}: no such file: this run kept no best-evaluated weights ({why}); {fix}")
    if needed := policy_class(cfg, run_dir).files_needed(task_settings(cfg)):
        names = ", ".join(needed)
        raise EvalError(f"{path}: this run's policy acts with {names} beside its weights, and best.pt has none of the "
                        f"evaluation it was kept at ({names} {'holds' if len(needed) == 1 else 'hold'} the final ones); {fix}")
    try:
        return load_safely(path, "best-evaluated weights")
    except CheckpointError as exc:
        raise EvalError(str(exc)) from None


def evaluate_run(options: Options, out: Path | None = None, weights: str = "model") -> dict:
    """Replay the RL run in `options.run_dir` (eval.json, videos, the run's loggers), or score the model.pt of a run
    without an env on a data split (`model_eval`, eval.json). Here, at the entry point, so that the replay code
    (which training also uses for its videos) never imports the scoring code that builds tasks through run.py.
    `weights="best"`: an RL run's best.pt instead of model.pt."""
    cfg, run_seed = find_config(options.run_dir)
    state = None
    if weights == "best":
        state = best_weights(cfg, options.run_dir, fix=f"evaluate {MODEL}: leave out weights=best")
    if has_env(cfg):
        task_only = sorted(options.given & {"split", "data"})
        if task_only:
            raise EvalError(f"{'= and '.join(f'{k}.<key>' if k == 'data' else k for k in task_only)}= score supervised and "
                            "GAN runs; an RL run is replayed in its env: episodes=, video=, seed=")
        result = play(options, cfg, run_seed, state_dict=state, video_name="replay-best" if state is not None else "replay")
        result["weights"] = weights
        result["logged_to"] = log_to_run_loggers(cfg, result, options.run_dir)
    else:
        from pipeline.runtime.model_eval import score_run

        result = score_run(options, cfg, run_seed)
    target = check_writable(options, out)
    target.mkdir(parents=True, exist_ok=True)
    write_json(target / EVAL_FILE, result)
    result["eval_file"] = str(target / EVAL_FILE)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(f"{USAGE}\n\n{__doc__.strip()}")
        return 0
    out = next((a.split("=", 1)[1] for a in argv if a.startswith("out=")), None)
    weights = next((a.split("=", 1)[1] for a in argv if a.startswith("weights=")), "model")
    argv = [a for a in argv if not a.startswith(("out=", "weights="))]
    try:
        if out == "":
            raise EvalError("out= needs a dir; e.g. out=evals/my_run")
        if weights not in ("model", "best"):
            raise EvalError(f"weights={weights}: choose model ({MODEL}, the weights at the end of training) or best "
                            f"({BEST}, an RL run's best-evaluated weights)")
        options = parse_args(argv)
        check_writable(options, None if out is None else Path(out))  # before any work
        result = evaluate_run(options, None if out is None else Path(out), weights)
    except EvalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if "metrics" in result:  # a scored model, not a replay
        from pipeline.runtime.model_eval import summary

        print(summary(result, Path(options_path(result))))
        return 0
    spread = "" if math.isnan(result["std"]) else f" ± {result['std']:.1f}"
    seeds = result["seeds"]
    which = " (best.pt)" if result.get("weights") == "best" else ""
    print(f"{result['episodes']} episodes of {result['env_id']}{which}: return {result['mean']:.1f}{spread} "
          f"(seeds {seeds[0]}-{seeds[-1]}) -> {options_path(result)}")
    if result.get("rendering"):  # how MuJoCo's frames were rendered (headless: EGL or OSMesa)
        print(result["rendering"])
    return 0


def options_path(result: dict) -> str:
    return str(result.get("eval_file") or Path(result["run_dir"]) / EVAL_FILE)


if __name__ == "__main__":
    sys.exit(main())
