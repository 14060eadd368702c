"""pipeline.config.grouping on configs written by hand (no Hydra): what is ignored, the id, the display names."""

from __future__ import annotations

import hashlib

import pytest

from pipeline.config import grouping
from pipeline.config.grouping import config_id, differences, flatten, group_name, is_ignored, semantic_config

# Every key the module docstring lists as not changing results, written out by hand.
IGNORED_BY_HAND = [
    "seed", "logger", "hydra", "resume", "ckpt_path", "trial", "device.num_threads", "seeds_per_process",
    "trainer.enable_progress_bar", "trainer.enable_model_summary", "callbacks.rich_progress_bar",
    "callbacks.model_summary", "run_dir", "sweep_dir", "checkpoint", "isolate_jobs", "task.save_replay",
    "task.replay_save_max_mb",
]


@pytest.mark.parametrize("key", IGNORED_BY_HAND)
def test_each_key_that_does_not_change_results_is_dropped_with_everything_under_it(key):
    assert is_ignored(key) and is_ignored(key + ".sub")
    assert not is_ignored(key + "x") and not is_ignored("x" + key)
    assert semantic_config({key: 1, "kept": 2}) == {"kept": 2}


def test_keys_next_to_ignored_ones_are_kept():
    kept = {"device": {"accelerator": "cpu"}, "trainer": {"max_epochs": 3}, "callbacks": {"early_stopping": 1},
            "task": {"gamma": 0.9}, "seeding": {"deterministic": True}}
    assert semantic_config(kept) == {"callbacks.early_stopping": 1, "device.accelerator": "cpu",
                                     "seeding.deterministic": True, "task.gamma": 0.9, "trainer.max_epochs": 3}
    assert list(semantic_config({"b": 1, "a": 2})) == ["a", "b"]
    assert is_ignored("a.b", ["a"]) and not is_ignored("a", ["a.b"]) and not is_ignored("ab", ["a"])


def test_flatten_keeps_an_empty_dict_as_a_plain_dict_and_uses_the_prefix():
    from omegaconf import OmegaConf

    flat = flatten(OmegaConf.create({"s": {}, "t": {"u": 1}}), "p.")
    assert flat == {"p.s": {}, "p.t.u": 1} and type(flat["p.s"]) is dict


def test_config_id_is_the_sha256_of_the_compact_sorted_json():
    # The text hashed, written by hand: sorted keys, no spaces, non-JSON values by str().
    text = '{"a.b":1,"c":[1,2],"d":"x y"}'
    expected = hashlib.sha256(text.encode()).hexdigest()[:8]
    assert config_id({"d": "x y", "seed": 5, "a": {"b": 1}, "c": [1, 2]}) == expected
    assert config_id({"c": [1, 2], "a.b": 1, "d": "x y"}, already_semantic=True) == expected
    # already_semantic keeps keys the semantic view would drop.
    assert config_id({"seed": 1}, already_semantic=True) == hashlib.sha256(b'{"seed":1}').hexdigest()[:8]
    assert config_id({"p": frozenset()}) == hashlib.sha256(b'{"p":"frozenset()"}').hexdigest()[:8]
    assert group_name({"x": {"y": 2}, "seed": 1}, "exp") == "exp " + hashlib.sha256(b'{"x.y":2}').hexdigest()[:8]


def test_long_values_are_cut_to_forty_characters_and_non_strings_shown_as_json():
    long = "a" * 41
    names = differences({"one": {"k": long}, "two": {"k": "a" * 40}})
    assert names == {"one": "k=" + "a" * 39 + "…", "two": "k=" + "a" * 40}
    names = differences({"one": {"k": [1, 2]}, "two": {"k": None}, "three": {"k": True}, "four": {"k": "s"}})
    assert names == {"one": "k=[1, 2]", "two": "k=null", "three": "k=true", "four": "k=s"}


def test_four_parts_are_shown_then_a_count():
    configs = {"a": {f"k{i}": 0 for i in range(5)}, "b": {f"k{i}": 1 for i in range(5)}}
    assert differences(configs)["b"] == "k0=1 k1=1 k2=1 k3=1 +1 more"
    four = {"a": {f"k{i}": 0 for i in range(4)}, "b": {f"k{i}": 1 for i in range(4)}}
    assert differences(four)["a"] == "k0=0 k1=0 k2=0 k3=0"


def test_a_chosen_group_replaces_its_keys_and_ignored_choices_never_show():
    configs = {"a": {"model.hidden": [4], "model.act": "relu", "lr": 1},
               "b": {"model.hidden": [8], "model.act": "tanh", "lr": 2}}
    choices = {"a": {"model": "mlp", "logger": "csv", "experiment": "e1", "callbacks/rich_progress_bar": "on",
                     "callbacks/model_summary": "on", "hydra/launcher": "basic"},
               "b": {"model": "cnn", "logger": "many", "experiment": "e2", "callbacks/rich_progress_bar": "off",
                     "callbacks/model_summary": "off", "hydra/launcher": "joblib"}}
    assert differences(configs, choices) == {"a": "model=mlp lr=1", "b": "model=cnn lr=2"}
    # A group chosen alike everywhere names nothing; the differing keys under it are shown instead.
    same = {"a": {"model": "mlp"}, "b": {"model": "mlp"}}
    assert differences(configs, same) == {"a": "lr=1 model.act=relu model.hidden=[4]",
                                          "b": "lr=2 model.act=tanh model.hidden=[8]"}
    # A config without choices counts as choosing nothing (None) in every group.
    assert differences({"a": {}, "b": {}}, {"a": {"model": "mlp"}}) == {"a": "model=mlp", "b": "model=None"}
    # Nested choice groups: covered keys are those under the group's dotted path.
    nested = {"a": {"task.env.id": 1, "task.gamma": 1}, "b": {"task.env.id": 2, "task.gamma": 2}}
    assert differences(nested, {"a": {"task/env": "x"}, "b": {"task/env": "y"}}) == {
        "a": "task/env=x task.gamma=1", "b": "task/env=y task.gamma=2"}


def test_sweep_id_comes_from_the_environment_and_is_made_once(monkeypatch):
    monkeypatch.delenv("PIPELINE_SWEEP_UID", raising=False)
    assert grouping.sweep_id() is None
    monkeypatch.setenv("PIPELINE_SWEEP_UID", "")
    assert grouping.sweep_id() is None
    uid = grouping.start_sweep_id()
    assert len(uid) == 6 and int(uid, 16) >= 0
    assert grouping.sweep_id() == uid and grouping.start_sweep_id() == uid
    monkeypatch.setenv("PIPELINE_SWEEP_UID", "abc")
    assert grouping.start_sweep_id() == "abc"


def test_dicts_inside_lists_hash_alike_in_any_key_order_and_odd_values_are_shown_by_str():
    assert config_id({"a": [{"y": 1, "x": 2}]}) == config_id({"a": [{"x": 2, "y": 1}]})
    assert config_id({"a": [{"y": 1, "x": 2}]}, already_semantic=True) == hashlib.sha256(
        b'{"a":[{"x":2,"y":1}]}').hexdigest()[:8]
    assert differences({"one": {"k": frozenset()}, "two": {"k": 1}}) == {"one": 'k="frozenset()"', "two": "k=1"}


def test_a_resumed_sweep_keeps_the_id_it_had_even_after_another_was_made(monkeypatch):
    monkeypatch.delenv("PIPELINE_SWEEP_UID", raising=False)
    fresh = grouping.start_sweep_id()
    assert grouping.start_sweep_id("0f1e2d") == "0f1e2d" != fresh
    assert grouping.sweep_id() == "0f1e2d" and grouping.start_sweep_id() == "0f1e2d"
    assert grouping.start_sweep_id(None) == "0f1e2d"


def test_the_internal_debug_groups_trainer_debug_picks_never_name_a_group():
    configs = {"a": {"task.gamma": 0.9}, "b": {"task.gamma": 0.99}}
    choices = {"a": {"task": "dqn", "trainer": "debug", "debug": "debug", "debug/task": "debug_dqn", "debug/env": "debug_cartpole"},
               "b": {"task": "ppo", "trainer": "debug", "debug": "debug", "debug/task": "debug_ppo", "debug/env": "debug_pendulum"}}
    assert differences(configs, choices) == {"a": "task=dqn", "b": "task=ppo"}


def test_floats_in_a_name_are_rounded_for_display_only_and_still_told_apart():
    """A tuner's learning rates read 0.002346, not 0.0023456789012345678 (19 digits in a group's name); values that
    agree in 4 digits get as many as tell them apart; the config ids (the grouping) still see every digit."""
    configs = {"a": {"optimizer.lr": 0.0023456789012345678, "m": [0.1 + 0.2, 1]},
               "b": {"optimizer.lr": 0.00071234567890123456, "m": [0.5, 1]}}
    assert differences(configs) == {"a": "m=[0.3, 1] optimizer.lr=0.002346", "b": "m=[0.5, 1] optimizer.lr=0.0007123"}
    close = {"a": {"x": 1.23456789}, "b": {"x": 1.23459999}, "c": {"x": 1.3}}
    assert differences(close) == {"a": "x=1.23457", "b": "x=1.2346", "c": "x=1.3"}
    alike = {"a": {"x": 0.1 + 0.2}, "b": {"x": 0.3}}  # apart only in the 17th digit: all of them shown
    assert differences(alike) == {"a": "x=0.30000000000000004", "b": "x=0.3"}
    assert config_id(alike["a"], already_semantic=True) != config_id(alike["b"], already_semantic=True)
