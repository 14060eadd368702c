"""Mutation score of the core modules: mutmut 3.8.1, one module at a time, each against its own fast tests.

    python tools/mutate.py                     # the modules in DEFAULT (~15 min on 2 cores)
    python tools/mutate.py rl/schedules.py     # named modules (keys of MODULES)
    python tools/mutate.py --stable            # every module whose score has been measured (hours)
    python tools/mutate.py --all               # every module in MODULES
    python tools/mutate.py --max-children 1    # fewer parallel test processes (default: 2)

Each module runs in its own scratch directory (outputs/mutation/work/<module>/) holding a setup.cfg
with the module's [mutmut] section and links to src/, tests/ and pyproject.toml: mutmut 3 reads one
configuration from the working directory and copies src/ into mutants/ there, which then shadows the
editable install on sys.path (pipeline.conf still resolves through the editable finder to conf/).
The last line printed is `mutation score: K/N killed (P%)` over the non-equivalent mutants of the
modules run; outputs/mutation/summary.json has the counts per module and the survivors, each as the
entry to paste (with a reason) if it changes no behaviour.

Equivalent mutants sit in one file per module, tools/mutation/<module path>.txt (src/pipeline/rl/replay.py:
tools/mutation/rl/replay.txt), keyed by what the mutant changes, not by mutmut's number (which shifts
whenever the module changes): each entry is four lines,

    Class.method                          the function (or a top-level function's name)
      - the source line as written        (whitespace collapsed; several lines joined when the mutated
      + the line as the mutant has it      expression spans them)
      why it changes no behaviour

A surviving mutant whose function, line and mutated line match an entry counts as equivalent. An entry
that matches no surviving mutant is printed as stale (the line was edited, or a new test kills it).

mutmut 3 does not mutate functions carrying a decorator other than @staticmethod/@classmethod
(e.g. @torch.no_grad(), @property): their bodies are outside the score.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "mutation"
EQUIVALENT_DIR = ROOT / "tools" / "mutation"
MUTMUT = Path(sys.executable).with_name("mutmut")
CLASS_SEPARATOR = "ǁ"  # mutmut's x<sep>Class<sep>method names

# Module (under src/pipeline/) -> the fast tests that should kill its mutants.
MODULES: dict[str, list[str]] = {
    "rl/schedules.py": ["tests/rl/test_schedules.py", "tests/rl/test_schedules_properties.py"],
    "rl/targets.py": ["tests/rl/test_targets.py", "tests/rl/test_targets_properties.py"],
    "rl/replay.py": ["tests/rl/test_replay.py", "tests/rl/test_replay_properties.py", "tests/rl/test_replay_continuous.py"],
    "rl/offpolicy.py": ["tests/rl/test_sac_pieces.py"],
    "rl/squashed_gaussian.py": ["tests/rl/test_sac_pieces.py"],
    "rl/cartpole_tensor.py": ["tests/rl/test_cartpole_tensor.py", "tests/rl/test_cartpole_properties.py"],
    "rl/acrobot_tensor.py": ["tests/rl/test_acrobot_tensor.py"],
    "rl/tensor_env.py": ["tests/rl/test_tensor_env.py"],
    "rl/vector.py": ["tests/rl/test_vector.py"],
    "rl/gym_state.py": ["tests/rl/test_gym_state.py"],
    "rl/acting.py": ["tests/rl/test_acting.py"],
    "rl/envs.py": ["tests/rl/test_envs.py"],
    "rl/ppo.py": ["tests/rl/test_ppo_pieces.py"],
    "rl/pendulum_tensor.py": ["tests/rl/test_pendulum_tensor.py"],
    # games/ rules and small runtime modules (2026-12-04, third)
    "games/symmetry.py": ["tests/games/test_symmetry_units.py"],
    "games/rules.py": ["tests/games/test_rules_units.py", "tests/games/test_auction.py"],
    "runtime/devices.py": ["tests/test_devices.py"],
    "runtime/quiet.py": ["tests/test_quiet_units.py"],
    "runtime/preflight.py": ["tests/test_preflight_units.py"],
    "games/auction.py": ["tests/games/test_auction.py"],
    "sweep_progress.py": ["tests/test_sweep_progress.py", "tests/test_sweep_progress_units.py"],
    # tasks/ and runtime/ (2026-12-04, second)
    "runtime/callbacks.py": ["tests/test_callbacks.py", "tests/test_callbacks_units.py"],
    "tasks/counterfactual.py": ["tests/tasks/test_counterfactual_units.py"],
    "tasks/gan_metrics.py": ["tests/tasks/test_gan_metrics_units.py"],
    "runtime/loggers.py": ["tests/test_loggers_units.py"],
    "runtime/job.py": ["tests/test_job_units.py"],
    "runtime/run.py": ["tests/test_run_units.py"],
    "nets/actor_critic.py": ["tests/nets/test_actor_critic.py"],
    "nets/mlp.py": ["tests/nets/test_mlp.py"],
    "nets/heads.py": ["tests/nets/test_heads.py"],
    "nets/cnn.py": ["tests/nets/test_cnn.py"],
    "nets/ensemble.py": ["tests/nets/test_ensemble.py"],
    "nets/td_grad.py": ["tests/nets/test_td_grad.py"],
    "nets/factory.py": ["tests/nets/test_factory.py"],
    "report/stats.py": ["tests/report/test_report_stats.py", "tests/report/test_stats_properties.py"],
    "report/curves.py": ["tests/report/test_curves_units.py"],
    "store/record.py": ["tests/test_record.py"],
    "store/curves.py": ["tests/test_store_units.py"],
    "store/layout.py": ["tests/test_store_units.py"],
    "store/checkpoint.py": ["tests/test_store_units.py"],
    "store/atomic.py": ["tests/test_store_atomic.py", "tests/test_store_units.py"],
    "tasks/dqn.py": ["tests/tasks/test_dqn_units.py"],
    "tasks/supervised.py": ["tests/test_supervised_units.py"],
    "tasks/cem.py": ["tests/tasks/test_cem_units.py", "tests/tasks/test_cem.py"],
    "games/rmac.py": ["tests/games/test_rmac_units.py"],
    # Measured 2026-12-04: objective 156/385 against test_objective alone; with test_summary and the tests that
    # run added (aggregate, seed_score, collect, maximize by hand), 349/385 (90.6%): in STABLE. space 196/265 ->
    # 247/247 (18 equivalent: 13 in the int-interval branch Hydra never reaches, its interval() makes floats);
    # study 35/133 -> 130/130 (3 equivalent) with test_study_units (open_storage, load_trial, the pruner and
    # samplers against real Optuna): both in STABLE.
    "tune/objective.py": ["tests/tune/test_objective.py", "tests/tune/test_summary.py"],
    "tune/space.py": ["tests/tune/test_space.py"],
    "tune/study.py": ["tests/tune/test_study.py", "tests/tune/test_study_units.py", "tests/tune/test_space.py"],
    "games/solver.py": ["tests/games/test_rmac_units.py", "tests/games/test_solver_units.py"],
    "games/asymmetric.py": ["tests/games/test_asymmetric.py", "tests/games/test_asymmetric_units.py"],
    "runtime/rundir.py": ["tests/test_rundir_units.py"],
    "runtime/checkpointing.py": ["tests/test_checkpointing_units.py"],
    "runtime/seeding.py": ["tests/test_seeding.py"],
    "runtime/context.py": ["tests/test_context.py", "tests/test_context_units.py"],
    "runtime/replay.py": ["tests/test_replay_units.py"],
    # report/ and tune/ (2026-12-04)
    "report/groups.py": ["tests/report/test_report_units.py"],
    "report/counterfactual.py": ["tests/report/test_report_units.py"],
    "report/summary.py": ["tests/report/test_report_units.py", "tests/report/test_stats_properties.py"],
    "report/build.py": ["tests/report/test_report_units.py"],
    "report/collect.py": ["tests/report/test_collect_units.py"],
    "report/markdown.py": ["tests/report/test_markdown_units.py"],
    "report/wandb_summary.py": ["tests/report/test_wandb_summary_units.py"],
    "tune/summary.py": ["tests/tune/test_tune_summary_units.py", "tests/tune/test_summary.py"],
    "tune/pruning.py": ["tests/tune/test_pruning_units.py", "tests/tune/test_pruning.py"],
    "tune/plots.py": ["tests/tune/test_tune_plots_units.py", "tests/tune/test_summary.py"],
    # config/ and tasks/ helpers (2026-12-04, third)
    "config/grouping.py": ["tests/test_grouping.py", "tests/test_grouping_units.py"],
    "config/checks.py": ["tests/test_checks_units.py"],
    "tasks/rl_task.py": ["tests/tasks/test_rl_task_units.py", "tests/tasks/test_ppo_units.py", "tests/tasks/test_dqn_units.py"],
    # ganunits (2026-12-04, fourth)
    "tasks/gan.py": ["tests/tasks/test_gan_units.py"],
    # smallmods (2026-12-04, fourth)
    "runtime/cluster.py": ["tests/test_cluster_units.py"],
    "runtime/model_eval.py": ["tests/test_model_eval_units.py", "tests/test_eval_tasks.py"],
    # plotseval (2026-12-04, fourth)
    "report/plots.py": ["tests/report/test_plots_units.py", "tests/report/test_plots_style_units.py"],
    "eval.py": ["tests/test_eval_units.py", "tests/test_replay_units.py"],
    # ppounits (2026-12-04, fourth)
    "tasks/ppo.py": ["tests/tasks/test_ppo_units.py"],
    # basecli (2026-12-04, fourth)
    "tasks/base.py": ["tests/tasks/test_base_units.py", "tests/tasks/test_contract.py"],
    "report/cli.py": ["tests/report/test_report_cli_units.py"],
    "sweep.py": ["tests/test_sweep_units.py", "tests/test_sweep.py"],
    # netsdata (2026-12-04, fourth)
    "nets/gan.py": ["tests/nets/test_gan_nets_units.py"],
    "data/digits.py": ["tests/data/test_digits_units.py"],
    "data/digit_images.py": ["tests/data/test_digits_units.py"],
    "data/auction.py": ["tests/data/test_auction_data_units.py", "tests/data/test_auction_bids.py"],
    "games/bids_csv.py": ["tests/games/test_bids_csv_units.py", "tests/games/test_bids_csv.py", "tests/data/test_auction_bids.py"],
    "games/plots.py": ["tests/games/test_games_plots_units.py"],
    "data/atari_frames.py": ["tests/data/test_atari_frames_units.py", "tests/data/test_atari_frames.py"],
    # cli (2026-12-05, fifth)
    "cli.py": ["tests/test_cli_units.py"],
}
# `make mutate`: the core modules, sized to finish within 30 minutes on 2 cores at 2 children: 14 min 37 s from
# scratch on 2 quiet cores (docs/development.md).
DEFAULT = [
    "rl/schedules.py",
    "rl/targets.py",
    "rl/replay.py",
    "rl/cartpole_tensor.py",
    "rl/tensor_env.py",
    "rl/acting.py",
    "rl/gym_state.py",
    "rl/envs.py",
    "rl/vector.py",
    "rl/ppo.py",
    "nets/mlp.py",
    "nets/heads.py",
    "nets/cnn.py",
    "nets/factory.py",
    "nets/ensemble.py",
    "nets/td_grad.py",
    "nets/actor_critic.py",
    "store/record.py",
    "report/stats.py",
    "tasks/supervised.py",
    "tasks/dqn.py",
]
# `--stable` (hours): every module whose score has been measured, with how it got there.
STABLE = [
    "rl/schedules.py",
    "rl/targets.py",
    "rl/replay.py",
    "rl/cartpole_tensor.py",
    "report/stats.py",
    "store/record.py",
    "nets/heads.py",
    "nets/mlp.py",
    "nets/ensemble.py",
    "nets/cnn.py",
    "nets/factory.py",
    "nets/td_grad.py",
    "rl/acting.py",
    "rl/tensor_env.py",
    "rl/acrobot_tensor.py",
    "rl/gym_state.py",
    "rl/envs.py",
    "rl/vector.py",
    "tasks/supervised.py",
    "tasks/dqn.py",
    "games/rmac.py",
    "rl/ppo.py",
    "rl/pendulum_tensor.py",
    "nets/actor_critic.py",
    # games/ rules and small runtime modules (2026-12-04, third), --max-children 1, first run of the new unit tests
    # -> final. games/symmetry.py had no fast test of its own (only runs of task=counterfactual): test_symmetry_units
    # (KS p-values known by hand, 2/252 for two separate samples of five) 44/48 (91.7%) -> 46/46 + 2 equivalent
    # (the float64 copy of the bids). games/rules.py with test_rules_units and test_auction 81/89 (91.0%) -> 82/82
    # + 7 equivalent (rstrip's character sets, the first-price name of any kind but second_price, eps_label's
    # unreachable "0"); the survivor killed: reserves rounded to eleven decimals, then written with ten.
    "games/symmetry.py",
    "games/rules.py",
    # runtime/devices.py with test_devices (its fast part, plus CUDA and MPS stood in for, the messages and log line by
    # hand) 78/82 (95.1%) -> 81/81 + 1 equivalent (the probe's 2e-39 is as denormal as 1e-39); the survivors killed:
    # a torch without torch.backends.mps, the float32 probe under a float64 default dtype. runtime/quiet.py 6/6
    # (test_quiet_units: the exact messages silenced, near misses still shown). runtime/preflight.py had no fast test
    # (only the slow CLI and durable runs): test_preflight_units (records, checkpoints and a held lock written by
    # hand) 178/184 (96.7%) -> 179/179 + 5 equivalent (wants_resume's ckpt_path part, read only where it is unset;
    # k = `seeds_per_process or 1` is never 0); the survivor killed: exactly six differences say "and 1 more".
    "runtime/devices.py",
    "runtime/quiet.py",
    "runtime/preflight.py",
    # games/auction.py with test_auction (its closed forms, simulated bids and default reserves) 120/134 (89.6%) ->
    # 133/134 (99.3%): the truths' default reserve, the simulation's defaults (two bidders, values U[0, 1] in float64),
    # its exact refusals, one bid, no positive bid. Left: reserve_top rounded to 11 decimals instead of 10, which
    # differs only for bids below ~1e-9, where the reserves' names (ten decimals) cannot tell the reserves apart anyway.
    "games/auction.py",
    # sweep_progress.py against test_sweep_progress as it was 303/385 (78.7%) -> 367/369 (99.5%) + 16 equivalent with
    # test_sweep_progress_units (the files written, snapshots and ETAs by hand, the poller, lines flushed at once, the
    # live line's redirects, bold text and erasure; equivalent: rich's defaults, select defaults that end as "", the
    # join timeout). Left: auto_refresh True (dropped, or set), a redraw thread that shows the same line.
    "sweep_progress.py",
    # tasks/ and runtime/ (2026-12-04, second), --max-children 1. runtime/callbacks.py against test_callbacks alone:
    # 81/174 (46.6%; early_stop_of had no fast test, only run()s in test_early_stopping) -> 167/167 + 7 equivalent
    # with test_callbacks_units (early_stop_of on EarlyStopping callbacks set by hand, trainer_kwargs' switches).
    "runtime/callbacks.py",
    # tasks/counterfactual.py had fast tests of none of its code (test_counterfactual's are all slow run()s): first
    # run of test_counterfactual_units (the task built by hand on a few hundred bids, coarse grid, few iterations)
    # 433/466 (92.9%) -> 459/459 + 7 equivalent (devices on a CPU machine, a `=` for `|=` on an empty dict).
    "tasks/counterfactual.py",
    # tasks/gan_metrics.py: test_gan's fast tests reach it through runs and a 4 s classifier fixture (34 s a pass);
    # first run of test_gan_metrics_units (the numbers by hand, a classifier on tiny separable data, both scorers on
    # a few dozen small images) 646/726 (89.0%) -> 683/684 + 23 equivalent on a full rerun after dropping the
    # never-called ClassifierQuality._scores (19 of the survivors), then 684/684 (the defaults' batch size pinned).
    "tasks/gan_metrics.py",
    # runtime/loggers.py: its tests (test_loggers) train a run and start real W&B runs (~25 s a pass); first run of
    # test_loggers_units (W&B stood in for, TensorBoard and CSV real) 433/444 (97.5%) -> 438/438 + 6 equivalent.
    "runtime/loggers.py",
    # runtime/job.py had only slow sweep tests (test_durable, test_sweep); test_job_units (the child process stood
    # in for, signals sent to the test's own process): 484/602 (80.4%; child_main had no test) -> 553/558 + 44
    # equivalent on a full rerun, then 554/555 + 47 (a check of the survivors after two more assertions). Left:
    # previous[sig] = None, which the signal tests detect by dying of SIGTERM (mutmut: "suspicious").
    "runtime/job.py",
    "tune/objective.py",
    # Measured 2026-12-04 (--max-children 1). store/record.py (was keyed "record.py", a file that moved): 172/231
    # (74.5%, its equivalents listed under the old name) -> 216/216 with 15 equivalents, tests for the schema check,
    # read_records and summary_line. The rest had no entry before; first run of the new unit tests -> final:
    # report/curves.py 332/346 (96.0%) -> 337/337 + 9 equivalent (after the band over the started seeds, fourth
    # session: 356/356 + 11); store/curves.py 119/134 -> 123/123 + 11;
    # store/layout.py 62/66 -> 62/62 + 4; store/checkpoint.py 140/156 -> 140/140 + 16 (CUDA-only lines on a
    # CPU machine); store/atomic.py 61/67 -> 63/63 + 4.
    "report/curves.py",
    "store/curves.py",
    "store/layout.py",
    "store/checkpoint.py",
    "store/atomic.py",
    "tune/space.py",
    "tune/study.py",
    # Measured 2026-12-04 (--max-children 1), first run of the new unit tests -> final: runtime/rundir.py 149/172
    # (86.6%) -> 163/163 + 9 equivalent (the early SIGINT/SIGTERM handler, tested in a forked child, had no test
    # mutmut could see); runtime/checkpointing.py 119/122 -> 119/119 + 3; runtime/seeding.py 33/34 -> 34/34;
    # runtime/context.py 179/183 -> 182/182 + 1. tasks/cem.py against test_cem_units as it was: 281/369 (76.2%)
    # -> 351/351 + 18 (tests of the logged metrics, the progress-bar value, the elite at the cutoff, the seeded sampler,
    # the manual optimisation, the missing-part messages; equivalent: device arguments on a CPU machine, defaults).
    "runtime/rundir.py",
    "runtime/checkpointing.py",
    "runtime/seeding.py",
    "runtime/context.py",
    "tasks/cem.py",
    # runtime/replay.py against tests/test_replay_units.py (run dirs written by hand, episodes checked against
    # gymnasium played by hand, real MP4s and GIFs, a stand-in wandb; ~3 s): 669/739 (90.5%) -> 709/717 (98.9%)
    # + 22 equivalent. Left: the uint8-observation path (Atari only), the MP4 quality setting (lossy bytes no
    # test pins), the GIF's 1000 ms (GIF keeps 10 ms steps) and fallback 30 fps (every MP4 carries its fps).
    "runtime/replay.py",
    # games/solver.py (the code moved out of games/rmac.py; its equivalents re-identified under the new names),
    # measured 2026-12-04 (--max-children 1): 724/847 against test_rmac_units alone (85.5%; 724/799 = 90.6% with
    # the 48 equivalents below) -> 799/799 + 48 equivalent, adding test_solver_units (several populations: outcomes
    # by enumeration, the nearest grid bid, the first-price start under a reserve, two populations of one against
    # one of two, Frank-Wolfe's first step by hand). Equivalent: dims spelled +1 for -1 on 2-D tensors, tolerances
    # that only absorb float noise, the statistic's unread arguments, the early stop, devices on a CPU machine.
    "games/solver.py",
    # report/ and tune/ (2026-12-04)
    # Measured 2026-12-04 (--max-children 1), first run of the new unit tests -> final: report/counterfactual.py
    # 116/117 -> 116/116 + 1 equivalent (test_report_units: coverage fractions and tables worked out by hand);
    # tune/pruning.py 93/93 (test_pruning_units: stand-in trials and trainers, the sweeper's defaults).
    "report/counterfactual.py",
    "tune/pruning.py",
    # report/summary.py 51/51 (test_report_units: the curve's final point is the table's CI, the given resampling).
    "report/summary.py",
    # report/groups.py against test_report_build (~10 s a mutant, stopped) -> test_report_units: 72/77 -> 74/74 + 3
    # equivalent (the id of an already semantic config); the survivors that kept the first-met config's short name.
    "report/groups.py",
    # tune/plots.py 139/155 (89.7%) -> 146/146 + 9 equivalent (test_tune_plots_units: the confirmation plot's points,
    # medians and labels, 100 dpi whatever the settings; equivalent: a Figure's .figure is itself, names read
    # case-insensitively, pyplot's current figure is the one closed).
    "tune/plots.py",
    # report/build.py 146/168 (86.9%) -> 159/159 + 9 equivalent (test_report_units: the given resampling, nested and
    # existing out dirs, report.md in UTF-8 under an ASCII locale, a counterfactual figure in the out dir;
    # equivalent: report.json is ASCII, NaN never reaches json.dumps, stack level 3 under mutmut's trampoline).
    "report/build.py",
    # report/wandb_summary.py 232/237 (97.9%) -> 237/237 (test_wandb_summary_units: a report written by hand against a
    # stand-in wandb; the slow offline test in test_report_wandb stays the end-to-end check).
    "report/wandb_summary.py",
    # report/markdown.py 675/691 (97.7%) -> 690/690 + 1 equivalent (test_markdown_units: the whole page of a report
    # written by hand, written out by hand). report/collect.py 127/142 (89.4%) -> 132/132 + 10 (test_collect_units:
    # records, curves and lock owners set up by hand; equivalent: stack levels seen through mutmut's trampoline,
    # float arrays of float CSV values). Only their undecorated functions are mutated (not ReportedRun's properties).
    "report/markdown.py",
    "report/collect.py",
    # tune/summary.py against test_summary and the first test_tune_summary_units: 1074/1231 (87.2%) -> 1197/1232
    # (97.2%) + 8 equivalent (tune.md by hand, best.yaml, write_tune on hand-made trials with and without a
    # confirmation, ties broken on the tuning and the fresh seeds, ties with the preset). Left: best.yaml with an
    # `=` inside an override's value and the choices' default, write_tune into a sweep dir that does not exist yet,
    # the objective handed to tie_breaker (the same answer for iqm), the direction handed to rank and
    # confirmed_entry where no seed fails, the empty-candidates guards. Its first run found the prefix bug in
    # best_yaml (seeding=deterministic dropped as if it were seed), fixed with a test.
    "tune/summary.py",
    # config/ and tasks/ helpers (2026-12-04, third)
    # Measured 2026-12-04 (--max-children 1), first run -> final: config/grouping.py 118/123 (95.9%) against
    # test_grouping and the new test_grouping_units (configs by hand: every ignored key, the id as the sha256 of the
    # compact sorted JSON, the 40-character cut, four parts then a count, chosen groups) -> 123/123 (two more
    # assertions: dicts inside lists hashed in any key order, odd values shown by str);
    # config/checks.py 515/565 (91.2%) against the new test_checks_units (each refusal's line on configs by hand,
    # the shipped groups read by hand, monitors against stand-in task classes) -> 518/543 (95.4%) + 22 equivalent
    # (OmegaConf.select/to_container arguments spelled as their defaults, the hydra node popped before a loop that
    # skips it, a missing _target_ read as "None", the `defaults` list never in a composed config). Left: an `=`
    # inside an override's value, loops that `break` for `continue` on their last item, get_close_matches' n, the
    # option-name strip characters, the hydra/experiment group filter of check_types.
    "config/grouping.py",
    "config/checks.py",
    # ganunits (2026-12-04, fourth)
    # tasks/gan.py (--max-children 1) against the new test_gan_units alone (a 1x2x2 pair, a dozen images, a stand-in
    # judge; a step redone by hand with autograd and SGD, the logged windows, checkpoints, samples, errors; ~3 s a
    # pass): first run 765/826 (92.6%) -> 817/817 (100%, one by timeout: save_png's scale multiplied) + 12 equivalent,
    # 829 mutants after the max_epochs=-1 fix; a full run takes ~320 s on one core. Equivalents: zero_grad's
    # set_to_none, untoggle_optimizer(None), self.log's on_step default, imsave's cmap on RGB, persistent=None,
    # the max_epochs=0 edge Lightning never reaches (tests/mutation_equivalent_ganunits.txt).
    "tasks/gan.py",
    # smallmods (2026-12-04, fourth), --max-children 1. runtime/cluster.py had no fast test (only the launcher's,
    # which needs a real SLURM): first run of test_cluster_units (sbatch/scontrol/sinfo stood in for, each refusal's
    # line by hand) 146/149 (98.0%, 18 s) -> 148/148 + 1 equivalent (the survivors killed: partition names ending in
    # other characters than the default's star); the last two checked with `mutmut run <names>`.
    "runtime/cluster.py",
    # runtime/model_eval.py had no MODULES entry; its pure parts against the new test_model_eval_units alone: 126/132
    # on the first run (score_run's 75 unreached) -> with test_eval_tasks' fast part (hand-made model.pt weights,
    # no training; ~3 s of tests) 183/202 (90.6%) + 5 equivalent in 168 s (full run); then, with a score_run test of
    # eval.json's keys on a hand-saved run, 195/202 (96.5%; the 19 survivors rechecked with `mutmut run <names>`).
    # Left: n_agents=2, the device handed to build_task/to() on a CPU machine (3), the CheckpointError's and the
    # misfit weights' messages (3).
    "runtime/model_eval.py",
    # plotseval (2026-12-04, fourth)
    # Measured 2026-12-04 (--max-children 1), first run -> final: report/plots.py against test_plots_units alone
    # 1249/1574 (79.4%); with the new test_plots_style_units (sizes in inches, 110 dpi, line widths, marker shapes
    # and sizes, colours off the default cycle, alphas, zorders, legend/title placement and font sizes, the jitter's
    # seed; the final diamond's CI arms around the point, two groups on one metric, a seed held after several points,
    # fit_to_text's overhang and margin on every edge, two metrics' file names) 1493/1574 (94.9%) -> 1534/1534
    # + 40 equivalent, a full run of 616 s on one core (colour names read case-insensitively, keywords spelled as the default style's values,
    # sharey=True's one y axis, Figure.colorbar finding the same image and axes, float arrays of float input).
    # eval.py against test_replay_units alone 50/217 -> 217/217 on the first run with the new test_eval_units
    # (main and parse_args in-process on run dirs written by hand: every option and its one-line error, the device
    # check, the printed lines, --help, the replay-or-score dispatch); 124 s on one core.
    "report/plots.py",
    "eval.py",
    # ppounits (2026-12-04, fourth)
    # tasks/ppo.py against the new test_ppo_units (the task driven through its hooks on 2 CartPole/Pendulum tensor
    # envs per agent: the rollout replayed with a plain ActorCritic, GAE by hand, updates redone with a hand-written
    # PPO loss + autograd + clip_grad_norm_ + Adam, K-agent against single runs, normalisers, logging, evaluation,
    # checkpoints through a file): 805/912 (88.3%) on the first run -> 887/887 (100%) + 25 equivalent (device
    # arguments on the CPU, defaults spelled out, initial values overwritten before they are read); ~345 s a full
    # run on one core. (rollout carries @torch.no_grad(), so mutmut leaves it out; the tests still pin it.)
    # 2026-12-05, stop_at_return (agents leaving the batch): 1106/1106 + 34 equivalent, ~200 s on one core.
    "tasks/ppo.py",
    # basecli (2026-12-04, fourth), --max-children 1, full runs. tasks/base.py (the task contract) against
    # test_contract alone 13/136 (9.6%: its defaults and refusals had no direct test) -> with the new test_base_units
    # (stand-in tasks and trainer, a stand-in clock, every refusal's message by hand) 135/135 + 1 equivalent
    # (float("NAN")), 42 s. report/cli.py had only subprocess tests (test_report_cli, a report built each time):
    # first run of test_report_cli_units (main(argv) in-process, build_report stood in for, the summary table written
    # out by hand) 197/203 (97.0%) -> 199/199 + 4 equivalent (the --out probe's name and content, --out's
    # default=None), 31 s; the survivors killed: a filter that ignored every warning, the description.
    "tasks/base.py",
    "report/cli.py",
    # sweep.py (the sweep callback) had one fast test (test_sweep's sweep-id test, ~4 s); the rest are slow real
    # sweeps: against it alone 19/337 (5.6%, 249 with no test), 31 s. With the new test_sweep_units (configs, records,
    # job returns and a stand-in progress display by hand: the resume command and refusal, per-job lines and progress
    # files, unfinished runs, the report and W&B summary at the end, every line flushed) 298/337 (88.4%) on its
    # first full run -> the 39 survivors rechecked with `mutmut run <names>`: 330/330 + 7 equivalent (_key's maxsplit,
    # select defaults that end as "", records "" for None); a full rerun confirms 330/330 in 60 s.
    "sweep.py",
    # netsdata (2026-12-04, fourth), --max-children 1, first run -> final; none had a MODULES entry before.
    # nets/gan.py had no fast test of its own (test_gan's runs): test_gan_nets_units (layers, sizes, slopes, dropout,
    # kernel/stride/padding/bias by hand, the DCGAN init's N(0, 0.02)/N(1, 0.02), refusals) 356/367 (97.0%, 64 s) ->
    # 359/359 + 8 equivalent (bias=None for False, padding 0 spelled as the default, _n_doublings' k below 8 px);
    # the 3 killed (sample_noise's device, MLPGAN's batch_norm) rechecked with `mutmut run <names>`.
    # data/digits.py 107/114 (93.9%, 59 s) -> 107/107 + 7 equivalent and data/digit_images.py 59/60 (23 s) -> 59/59
    # + 1 with test_digits_units (split sizes 1167/270/360 by hand, stratified, seeded; loaders; images in [-1, 1];
    # equivalent: upper bounds the sum check already refuses, DataLoader defaults). data/auction.py 90/90 (14 s,
    # test_auction_data_units: simulated bids redone with torch.rand, CSVs read once, each refusal's line).
    # games/bids_csv.py against test_bids_csv and test_auction_bids as they were: 679/888 (76.5%) -> 830/888 (93.5%,
    # full run, 212 s) with test_bids_csv_units (each refusal's whole line, inclusive limits, auction_id grouping,
    # named bidders, NaN words in any case, RowCounts). Left (not listed as equivalent, most of them are): the
    # empty-body branches' zeros/dtypes, dtypes of arrays numpy infers the same, errors="replace" on text already
    # checked to be UTF-8, the `n < 2` refusal no layout reaches (8), the stable argsort, the header quote cut at 1001 characters.
    # games/plots.py 206/221 (93.2%, 142 s, test_games_plots_units: the figure captured, its lines, bands, alphas,
    # labels, size, under another matplotlib style too) -> 216/216 + 5 equivalent; data/atari_frames.py 201/213 (94.4%,
    # 81 s, test_atari_frames_units: a stand-in env, caches by hand; plus test_atari_frames' fast part) -> 207/207 + 6
    # equivalent (register_envs is a no-op, the unused action_space seed, `step -= 1` keeps the same steps); their
    # killed survivors rechecked with `mutmut run <names>`. Equivalents: tests/mutation_equivalent_netsdata.txt.
    "nets/gan.py",
    "data/digits.py",
    "data/digit_images.py",
    "data/auction.py",
    "games/bids_csv.py",
    "games/plots.py",
    "data/atari_frames.py",
    # cli (2026-12-05, fifth), --max-children 2, full runs: cli.py against tests/test_cli_units.py alone (61
    # in-process tests, ~3 s): 227/263 (86.3%) -> 248/248 + 15 equivalent, 47 s a full run. It was LEFT_OUT (its
    # tests only ran `python -m pipeline` processes, which import the installed package, not mutmut's copy).
    # Real bug found: `--config-dir=DIR` (argparse's other spelling) was not seen as a user's config folder, so
    # the packaged groups refused an option that lives only there.
    "cli.py",
    # SAC/TD3 pieces (2026-12-06), --max-children 2, against tests/rl/test_sac_pieces.py: rl/squashed_gaussian.py
    # 53/68 (77.9%) -> 68/68; rl/offpolicy.py 91/124 (73.4%) -> 120/120 + 4 equivalent (mean over dim 1 for -1 on
    # [K, B]). Killed: the global-generator path, dtype and device of the noise (float64, the meta device), both clamp
    # edges, zero smoothing noise or clip allowed, reductions and alpha's shape with K != B, boolean terminations.
    "rl/squashed_gaussian.py",
    "rl/offpolicy.py",
]
# Modules under src/pipeline/ that `make mutate` leaves out, and why; printed after every default run (the
# summary's "left out" list). A module in MODULES but not in STABLE without an entry here is "not in STABLE yet".
LEFT_OUT: dict[str, str] = {
    # tasks/ and runtime/ (2026-12-04, second)
    "runtime/run.py": "1197 mutants; the lifecycle (run_job, _run_locked, _finish, _fail, _interrupted, "
    "_start_records, make_trainer, build_task: 1000 of them) is reached only by tests that train runs (0.5-9 s each "
    "across a dozen files; test_early_stopping.py alone is 21.7 s a pass), so the file as a whole is not measured. "
    "Its pure helpers against test_run_units (2026-12-04): 185/197 on the first run, 190/194 (97.9%) with 3 "
    "equivalent after two more assertions; the whole file against test_run_units alone 185/1197 (15.5%). Left: 4 "
    "in task_config (the _target_ filter, full_key `and` for `or` key, the message for an error without a key)",
    "games/asymmetric.py": "658 mutants against test_asymmetric (~17 s of Monte Carlo, quadrature and solver runs a "
    "pass) would take ~35 min; measured on random samples instead (2026-12-04, `mutmut run <names>` in its work "
    "folder, names drawn by random.Random(seed).sample over the sorted names): seed 2026, 50 mutants, 39/47 (83.0%, "
    "3 equivalent) before test_asymmetric_units; a fresh sample (seed 2027, 50 others) after it 42/45 (93.3%, 5 "
    "equivalent). Left in those samples: _point_mask's upper cell edge, the scale's cap in asymmetric_bounds (dropped, or / unit "
    "for * unit), the CDF pinned at the second-to-last instead of the last edge, one fewer regular CDF point",
    # config/ and tasks/ helpers (2026-12-04, third)
    "tasks/configs.py": "dataclasses of defaults and no function: mutmut 3 mutates only function bodies, so it has no "
    "mutant a test can reach (2026-12-04: 'could not find any test case for any mutant' against a test of every "
    "schema's defaults against conf/task/*.yaml); tests/tasks/test_contract.py already pins each schema to its YAML",
    # smallmods (2026-12-04, fourth)
    "runtime/progress_bar.py": "65 mutants; tests/test_progress_bar_units.py (11 tests, ~3 s a pass, the hooks called "
    "by hand on a task with a budget, the bar drawn into a string) passes alone, but under mutmut (2026-12-04) 31 of "
    "the 65 forked mutant runs time out and mutmut then never exits (34 killed, 0 survived when it stalled): the tqdm "
    "bars (or Lightning's import) hang in a forked child; not measured until that is understood",
}

STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    None: "not checked",
}


class MutantText(NamedTuple):
    """What a mutant changes, as a reader of the module sees it: stable while that line stays as it is."""

    function: str  # "name" or "Class.method"
    line: str  # the source line(s) holding the mutated expression, whitespace collapsed
    mutated: str  # the same line(s) with the mutation


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _function_label(mangled: str) -> str:
    """x_name -> name; xǁClassǁmethod -> Class.method."""
    if mangled.startswith("x" + CLASS_SEPARATOR):
        cls, _, name = mangled[2:].partition(CLASS_SEPARATOR)
        return f"{cls}.{name}"
    return mangled.removeprefix("x_")


def mutant_texts(source: str, filename: str = "module.py") -> dict[str, MutantText]:
    """mutmut 3.8.1's name of each mutant of ``source`` (``x_fn__mutmut_3``, without the module) -> its text.

    The same mutations, in the same order, that mutmut generates (its MutationVisitor over libcst); numbered as
    its trampolines number them: per top-level function or class method, 1, 2, ... in the visitor's order.
    """
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider
    from mutmut.mutation.file_mutation import MutationVisitor
    from mutmut.mutation.mutators import mutation_operators
    from mutmut.mutation.pragma_handling import get_ignored_lines

    wrapper = MetadataWrapper(cst.parse_module(source))
    visitor = MutationVisitor(mutation_operators, get_ignored_lines(filename, source, wrapper, None), None)
    wrapper.visit(visitor)
    positions = wrapper.resolve(PositionProvider)
    module = wrapper.module
    mangled: dict[int, str] = {}
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef):
            mangled[id(statement)] = f"x_{statement.name.value}"
        elif isinstance(statement, cst.ClassDef) and isinstance(statement.body, cst.IndentedBlock):
            for method in statement.body.body:
                if isinstance(method, cst.FunctionDef):
                    mangled[id(method)] = f"x{CLASS_SEPARATOR}{statement.name.value}{CLASS_SEPARATOR}{method.name.value}"
    lines = source.splitlines()
    counts: Counter = Counter()
    texts = {}
    for mutation in visitor.mutations:
        owner = mutation.contained_by_top_level_function
        if owner is None or id(owner) not in mangled:
            continue
        name = mangled[id(owner)]
        counts[name] += 1
        where = positions[mutation.original_node]
        span = lines[where.start.line - 1 : where.end.line]
        before, after = span[0][: where.start.column], span[-1][where.end.column :]
        mutated = before + module.code_for_node(mutation.mutated_node) + after
        texts[f"{name}__mutmut_{counts[name]}"] = MutantText(_function_label(name), _collapse("\n".join(span)), _collapse(mutated))
    return texts


def equivalent_file(module: str) -> Path:
    """tools/mutation/rl/replay.txt for rl/replay.py."""
    return EQUIVALENT_DIR / (module.removesuffix(".py") + ".txt")


def format_entry(text: MutantText, reason: str) -> str:
    return f"{text.function}\n  - {text.line}\n  + {text.mutated}\n  {reason}\n"


def load_equivalent(module: str) -> dict[MutantText, str]:
    """The entries of the module's file (none if it has no file): text -> reason. '#' starts a comment line."""
    path = equivalent_file(module)
    if not path.exists():
        return {}
    entries: dict[MutantText, str] = {}
    lines = [(i, line) for i, line in enumerate(path.read_text().splitlines(), 1) if line.strip() and not line.startswith("#")]
    for start in range(0, len(lines), 4):
        chunk = lines[start : start + 4]
        where = f"{path.relative_to(ROOT)}:{chunk[0][0]}"
        shapes = [not chunk[0][1][0].isspace(), *(line.startswith(p) for (_, line), p in zip(chunk[1:], ("  - ", "  + ", "  ")))]
        if len(chunk) < 4 or not all(shapes) or chunk[3][1].startswith(("  - ", "  + ")):
            raise SystemExit(
                f"{where}: an entry is four lines: the function, '  - ' the line, '  + ' the mutated line, "
                "'  ' why it changes no behaviour"
            )
        text = MutantText(chunk[0][1].strip(), _collapse(chunk[1][1][4:]), _collapse(chunk[2][1][4:]))
        entries[text] = chunk[3][1].strip()
    return entries


def _setup_cfg(module: str, tests: list[str]) -> str:
    def lines(values: list[str]) -> str:
        return "".join(f"\n    {v}" for v in values)

    return (
        "[mutmut]\n"
        "source_paths = src\n"
        f"only_mutate = src/pipeline/{module}\n"
        f"pytest_add_cli_args_test_selection ={lines(tests)}\n"
        f"pytest_add_cli_args ={lines(['-m', 'not slow', '-p', 'no:cacheprovider', '--hypothesis-profile=ci'])}\n"
        # A mutant that loops forever is stopped after 5x its tests' clean time (mutmut's default 15x spent
        # ~215 of rl/acrobot_tensor.py's 286 s waiting on such mutants; 5x gave the same verdicts in 138 s).
        "timeout_multiplier = 5\n"
    )


def _work_dir(module: str) -> Path:
    return OUT / "work" / module.replace("/", "_").removesuffix(".py")


def run_module(module: str, max_children: int) -> dict:
    tests = [t for t in MODULES[module] if (ROOT / t).exists()]
    if not tests:
        raise SystemExit(
            f"no tests exist for {module} (expected {MODULES[module]}); write them or drop the module"
        )
    work = _work_dir(module)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for name in ("src", "tests", "pyproject.toml"):
        (work / name).symlink_to(ROOT / name)
    (work / "setup.cfg").write_text(_setup_cfg(module, tests))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    start = time.perf_counter()
    proc = subprocess.run(
        [str(MUTMUT), "run", "--max-children", str(max_children)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    (work / "mutmut.log").write_text(proc.stdout + proc.stderr)
    meta = work / "mutants" / "src" / "pipeline" / (module + ".meta")
    if proc.returncode != 0 or not meta.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise SystemExit(
            f"mutmut failed on {module} (exit {proc.returncode}); log: {work / 'mutmut.log'}\n"
            + "\n".join(tail)
        )
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {"codes": codes, "texts": named_texts(module, codes), "wall_s": round(time.perf_counter() - start, 1),
            "tests": tests}


def named_texts(module: str, codes: dict) -> dict[str, MutantText]:
    """mutmut's full mutant names of this run -> their texts; refuses if the two do not name the same mutants."""
    prefix = "pipeline." + module.removesuffix(".py").replace("/", ".") + "."
    texts = {prefix + short: text for short, text in mutant_texts((ROOT / "src" / "pipeline" / module).read_text(),
                                                                  f"src/pipeline/{module}").items()}
    if set(texts) != set(codes):
        raise SystemExit(
            f"{module}: the mutants mutmut ran are not the ones tools/mutate.py generates ({len(codes)} against "
            f"{len(texts)}): mutmut is not 3.8.1, or the module changed during the run; rerun it"
        )
    return texts


def summarize(results: dict[str, dict], equivalents: dict[str, dict[MutantText, str]]) -> dict:
    per_module = {}
    for module, result in results.items():
        counts: Counter = Counter()
        survivors = []
        equivalent = equivalents.get(module, {})
        matched = set()
        for name, code in sorted(result["codes"].items()):
            status = STATUS.get(code, "suspicious")
            text = result["texts"][name]
            if status == "survived" and text in equivalent:
                status = "equivalent"
                matched.add(text)
            counts[status] += 1
            if status in ("survived", "no tests", "suspicious", "not checked"):
                survivors.append({"mutant": name, "status": status, "entry": format_entry(text, "<why it changes no behaviour>")})
        scored = counts["killed"] + counts["timeout"] + len(survivors)
        per_module[module] = {
            "killed": counts["killed"],
            "survived": counts["survived"],
            "timed_out": counts["timeout"],
            "equivalent": counts["equivalent"],
            "other": {
                k: v for k, v in counts.items() if k not in ("killed", "survived", "timeout", "equivalent")
            },
            "score": (counts["killed"] + counts["timeout"]) / scored if scored else None,
            "survivors": survivors,
            "stale_equivalent": [format_entry(t, r) for t, r in equivalent.items() if t not in matched],
            "tests": result["tests"],
            "wall_s": result["wall_s"],
        }
    killed = sum(m["killed"] + m["timed_out"] for m in per_module.values())
    total = sum(m["killed"] + m["timed_out"] + len(m["survivors"]) for m in per_module.values())
    return {
        "tool": "mutmut 3.8.1",
        "killed": sum(m["killed"] for m in per_module.values()),
        "survived": sum(m["survived"] for m in per_module.values()),
        "timed_out": sum(m["timed_out"] for m in per_module.values()),
        "equivalent": sum(m["equivalent"] for m in per_module.values()),
        "score": killed / total if total else None,
        "killed_or_timed_out": killed,
        "non_equivalent": total,
        "modules": per_module,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "modules", nargs="*", help=f"modules under src/pipeline/ (default: {' '.join(DEFAULT)})"
    )
    parser.add_argument("--stable", action="store_true", help="every module whose score has been measured (hours)")
    parser.add_argument("--all", action="store_true", help="every configured module")
    parser.add_argument("--max-children", type=int, default=2, help="parallel test processes (default 2)")
    args = parser.parse_args(argv)
    modules = list(MODULES) if args.all else list(STABLE) if args.stable else (args.modules or DEFAULT)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; choose from {sorted(MODULES)}")
    equivalents = {module: load_equivalent(module) for module in modules}  # a malformed file fails before any run
    results = {}
    for module in modules:
        print(f"mutating {module} against {' '.join(MODULES[module])} ...", flush=True)
        results[module] = run_module(module, args.max_children)
        print(f"  done in {results[module]['wall_s']} s", flush=True)
    summary = summarize(results, equivalents)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for module, m in summary["modules"].items():
        names = [s["mutant"].rsplit(".", 1)[-1] for s in m["survivors"]]
        shown = ", ".join(names[:8]) + (
            f", ... ({len(names) - 8} more in summary.json)" if len(names) > 8 else ""
        )
        print(
            f"  {module}: {m['killed'] + m['timed_out']} killed, {m['equivalent']} equivalent, "
            f"{len(names)} left{': ' + shown if names else ''}"
        )
        if names:
            print(
                f"    see one: (cd {_work_dir(module).relative_to(ROOT)} && {MUTMUT} show <full mutant name>); "
                f"summary.json has each as the entry to add to {equivalent_file(module).relative_to(ROOT)} if it "
                "changes no behaviour"
            )
        if m["stale_equivalent"]:
            print(
                f"    {len(m['stale_equivalent'])} entries of {equivalent_file(module).relative_to(ROOT)} match no "
                "surviving mutant (the line was edited, or a test now kills it): recheck and remove them; the first:\n"
                + "".join("      " + line + "\n" for line in m["stale_equivalent"][0].splitlines()).rstrip()
            )
    not_run = [m for m in [*MODULES, *LEFT_OUT] if m not in results]
    groups = {
        "of the default set, not named in this run": [m for m in not_run if m in DEFAULT],
        "measured with --stable": [m for m in not_run if m in STABLE and m not in DEFAULT],
        "not in STABLE yet": [m for m in not_run if m in MODULES and m not in STABLE and m not in LEFT_OUT],
    }
    if not_run:
        print("  left out of this run, and why:")
        for why, names in groups.items():
            if names:
                print(f"    {len(names)} {why}: {' '.join(names)}")
        for module in (m for m in not_run if m in LEFT_OUT):
            print(f"    {module}: {LEFT_OUT[module]}")
    pct = 100 * summary["score"] if summary["score"] is not None else 0.0
    print(f"summary: {OUT / 'summary.json'}")
    print(f"mutation score: {summary['killed_or_timed_out']}/{summary['non_equivalent']} killed ({pct:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
