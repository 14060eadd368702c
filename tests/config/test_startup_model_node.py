"""The start-up check of a model of the user's own reads the model node's instantiate flags as Hydra reads them: a flag
the YAML leaves out is Hydra's default (no `_partial_`: Hydra builds the model without the sizes, so the run is
refused), whatever the check's own fallbacks say. Each spelling a user can write is tried: absent, false, true.

The model is a torch class (not from pipeline.*), which takes DQN's in_features and out_features.
"""

import pytest
from omegaconf import OmegaConf, open_dict

from pipeline.config.errors import ConfigError
from pipeline.config.startup import check_run

DUTY = "task=dqn builds it as model(in_features=..., out_features=...) with forward(obs [N, *obs_shape]) -> Q-values "


def with_model(make_cfg, node: dict):
    cfg = make_cfg("experiment=dqn_cartpole")
    with open_dict(cfg):
        cfg.model = OmegaConf.create(node)
    return cfg


@pytest.mark.parametrize("flags", [{}, {"_partial_": False}], ids=["absent", "false"])
def test_a_users_model_hydra_would_build_without_the_sizes_is_refused(make_cfg, flags):
    with pytest.raises(ConfigError) as info:
        check_run(with_model(make_cfg, {"_target_": "torch.nn.Linear", **flags}))
    assert str(info.value).startswith("model (torch.nn.Linear) needs _partial_: true in its YAML (the task calls it with "
                                      "the sizes only it knows); " + DUTY)


def test_a_partial_users_model_taking_the_sizes_passes(make_cfg):
    checked = check_run(with_model(make_cfg, {"_target_": "torch.nn.Linear", "_partial_": True, "bias": False}))
    assert OmegaConf.to_container(checked.cfg.model) == {"_target_": "torch.nn.Linear", "_partial_": True, "bias": False}
