"""The shipped conf/ tree: where it is, and the options of each config group."""

from __future__ import annotations

import importlib.resources
from functools import cache
from pathlib import Path


def conf_root() -> Path:
    """The packaged config dir (the checkout's conf/ in an editable install)."""
    return Path(str(importlib.resources.files("pipeline.conf")))


# Groups the defaults list chooses by itself (conf/debug/: what trainer=debug shrinks, picked by interpolation
# from the trainer, task and env options), never on the command line.
INTERNAL_GROUPS = ("debug",)


@cache
def group_options() -> dict[str, list[str]]:
    """{'model': ['dueling', 'mlp', ...], 'hydra/launcher': [...], ...} from the shipped conf/ tree."""
    root = conf_root()
    groups: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.yaml")):
        rel = path.relative_to(root)
        if len(rel.parts) < 2 or rel.parts[0] in INTERNAL_GROUPS:
            continue
        groups.setdefault("/".join(rel.parts[:-1]), []).append(rel.stem)
    return {g: sorted(opts) for g, opts in groups.items()}
