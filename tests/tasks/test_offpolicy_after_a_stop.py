"""The off-policy actor-critic layer after agents stop: an agent that goes on learning trains exactly as the single run
of its seed does, through the layer's own loop (`iterate()`: acting, storing, the learning start, the delayed actor and
target steps), whichever agents stopped before it (slot 0 among them, so a slot read as an agent shows).
"""

import pytest
import torch

from tasks.test_sac_td3_units import make

# learning_starts 19: each agent's first 50-step iteration takes 31 critic steps (after env step 19), an odd count, so
# a delayed actor or target step counted on another agent's frozen counter falls on other steps than the agent's own.
HP = {"learning_starts": 19, "total_steps": 100, "policy_frequency": 2}
OWN = {"sac": {"target_network_frequency": 2}, "td3": {}}
NETS = {"sac": ("net", "critic", "critic_target"), "td3": ("net", "actor_target", "critic", "critic_target")}


@pytest.mark.parametrize("algo, stopped", [("td3", [0]), ("td3", [0, 1]), ("sac", [0]), ("sac", [1, 0])])
def test_an_agent_going_on_after_others_stop_trains_as_the_single_run_of_its_seed(algo, stopped):
    batch = make(algo, n_agents=3, seed=4, **HP, **OWN[algo])  # agents: seeds 4, 5, 6
    alone = make(algo, n_agents=1, seed=6, **HP, **OWN[algo])
    batch.iterate()
    alone.iterate()
    assert batch.updates == [31, 31, 31] and alone.updates == [31]
    batch.stop_agents(dict.fromkeys(stopped, "test"))
    survivors = [a for a in range(3) if a not in stopped]
    assert batch.slots == survivors
    batch.iterate()
    alone.iterate()
    assert batch.env_steps == alone.env_steps == 100
    assert batch.updates[2] == alone.updates[0] == 81 and all(batch.updates[a] == 31 for a in stopped)
    slot = batch.slots.index(2)
    for name in NETS[algo]:
        mine, single = getattr(batch, name).member_state_dict(slot), getattr(alone, name).member_state_dict(0)
        for k, v in single.items():
            # The same draws (agent 2's generator is the single run's); the batched kernels may sum in another order
            # (bitwise equal on this machine): float32 rounding compounded over 81 Adam steps, as test_sac_td3_units
            # allows. An Adam step moves a weight by up to lr (3e-4): steps taken on the wrong critic steps, or with
            # another agent's moments, over dozens of steps move it further than 1e-4.
            assert torch.allclose(mine[k], v, atol=1e-4), (name, k)
    if algo == "sac":
        assert torch.allclose(batch.log_alpha.detach()[slot], alone.log_alpha.detach()[0], atol=1e-4)
    # Its replay rows are its own envs' steps, as the single run's (rewards of actions equal within the tolerance above).
    assert torch.allclose(batch.buffer.state_dict()["rewards"][slot], alone.buffer.state_dict()["rewards"][0], atol=1e-4)
