"""`python -m pipeline.export <run dir> format=onnx`: for every kind of run the ONNX file that onnxruntime runs
computes what `pipeline.load` computes; the export's own check is a real bound on float32 rounding (it holds for
a float64 reference and refuses what lies outside it); without the onnx packages the option is one line."""

import shutil
import sys

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

import pipeline
from pipeline.export import compare, float32_error_bound
from pipeline.export import main as export_main
from pipeline.nets.factory import make_net
from pipeline.runtime.replay import EvalError, policy_class, run_env
from pipeline.store.checkpoint import save_atomic  # as the pipeline writes it: with its digest

ONNX_REASON = "format=onnx needs onnx, onnxruntime and onnxscript (pip install -e '.[onnx]')"


def onnxruntime_or_skip():
    for name in ("onnx", "onnxscript"):
        pytest.importorskip(name, reason=ONNX_REASON)
    return pytest.importorskip("onnxruntime", reason=ONNX_REASON)


# experiment and overrides -> (observation shape and dtype, action count or dimension, continuous)
RUNS = {
    "dqn_cartpole": ((), (4,), 2, False),
    "cem_cartpole": ((), (4,), 2, False),
    "ppo_pendulum": (("task.normalize_obs=true",), (3,), 1, True),
    "sac_pendulum": ((), (3,), 1, True),
    "td3_halfcheetah": (("env=pendulum_tensor",), (3,), 1, True),
    "ppo_atari": ((), (4, 84, 84), 6, False),  # Pong: uint8 frames into the CNN, 6 actions
}


def made_run(make_cfg, run_dir, experiment, *overrides, seed=0):
    """A run dir as the pipeline leaves it, without training: the composed config and the network its `model:`
    config builds as model.pt (seeded random weights; an RL network's perturbed, as its initial policy head is
    nearly constant)."""
    cfg = make_cfg(f"experiment={experiment}", *overrides)
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    torch.manual_seed(seed)
    factory = instantiate(cfg.model)
    if experiment == "gan_digits":
        net = factory(image_shape=(1, 8, 8))
    elif experiment == "supervised_digits":
        net = make_net(factory, 64, 10)
    else:  # the plain network the run's task declares its policy over (an actor-critic continuous on a Box, ...)
        env = run_env(cfg)
        net = policy_class(cfg, run_dir).network(factory, env.observation_space, env.action_space)
        env.close()
    if experiment in RUNS:
        with torch.no_grad():
            for p in net.parameters():
                p.add_(torch.randn_like(p) * 0.3)
    save_atomic(net.state_dict(), run_dir / "model.pt")
    if "task.normalize_obs=true" in overrides:
        save_atomic({"mean": torch.tensor([0.2, -0.1, 0.5], dtype=torch.float64), "var": torch.tensor([0.5, 2.0, 9.0], dtype=torch.float64),
                    "eps": torch.tensor(1e-8, dtype=torch.float64), "clip": torch.tensor(5.0, dtype=torch.float64)}, run_dir / "obs_norm.pt")
    return run_dir


@pytest.mark.parametrize("experiment", [e if e == "ppo_pendulum" else pytest.param(e, marks=pytest.mark.slow) for e in RUNS])
def test_the_onnx_policy_acts_as_the_loaded_agent(make_cfg, tmp_path, capsys, experiment):
    onnxruntime = onnxruntime_or_skip()
    overrides, obs_shape, _, continuous = RUNS[experiment]
    made_run(make_cfg, tmp_path, experiment, *overrides, *(() if experiment == "ppo_atari" else ("model.hidden=[32,32]",)))
    assert export_main([str(tmp_path), "format=onnx", f"n={4 if experiment == 'ppo_atari' else 16}"]) == 0
    assert f"wrote {tmp_path / 'policy.onnx'} (ONNX policy: [N, {', '.join(map(str, obs_shape))}] -> [N" in capsys.readouterr().out
    (tmp_path / "alone").mkdir()  # the file is all a user copies: it runs from another folder with nothing beside it
    alone = shutil.copy(tmp_path / "policy.onnx", tmp_path / "alone")
    session = onnxruntime.InferenceSession(alone, providers=["CPUExecutionProvider"])
    agent = pipeline.load(tmp_path)
    # Observations of other batch sizes than the export's (the batch dimension is free) and beyond the env's usual range.
    rng = np.random.default_rng(5)
    obs = (rng.integers(0, 256, size=(37, *obs_shape), dtype=np.uint8) if experiment == "ppo_atari"
           else rng.uniform(-3, 3, size=(257, *obs_shape)).astype(np.float32))
    [got] = session.run(None, {"obs": obs})
    [one] = session.run(None, {"obs": obs[:1]})
    assert one.shape == got[:1].shape
    expected = agent.act(obs)
    if continuous:
        low, high = agent.action_space.low, agent.action_space.high
        assert got.shape == (len(obs), 1) and (got >= low).all() and (got <= high).all()
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)  # float32 on [-2, 2]: ~1e-7 apart in practice
    else:
        with torch.no_grad():
            values = agent.policy.outputs(torch.as_tensor(obs))
        clear = values.topk(2, dim=1).values.diff(dim=1).abs().squeeze(1) > 1e-4
        assert clear.sum() > 0.9 * len(obs) and got.dtype == np.int64 and np.array_equal(got[clear.numpy()], expected[clear.numpy()])


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["supervised_digits", "gan_digits"])
def test_the_onnx_model_computes_the_loaded_network(make_cfg, tmp_path, experiment):
    onnxruntime = onnxruntime_or_skip()
    made_run(make_cfg, tmp_path, experiment)
    assert export_main([str(tmp_path), "format=onnx", "n=8", f"out={tmp_path / 'exported' / 'm.onnx'}"]) == 0
    session = onnxruntime.InferenceSession(str(tmp_path / "exported" / "m.onnx"), providers=["CPUExecutionProvider"])
    model = pipeline.load(tmp_path).model
    if experiment == "gan_digits":
        x, name, net = torch.randn(33, model.generator.latent_dim), "noise", model.generator
    else:
        x, name, net = torch.rand(33, 64) * 16, "input", model
    [got] = session.run(None, {name: x.numpy()})
    with torch.no_grad():
        expected = net(x).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * max(1.0, float(np.abs(expected).max())))


class _SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(2, 8, 3), nn.Tanh(), nn.Flatten(), nn.Linear(8 * 6 * 6, 64), nn.GELU(), nn.Linear(64, 5))

    def forward(self, x):
        return self.body(x)


def _batch_normed():
    net = nn.Sequential(nn.Linear(7, 64), nn.BatchNorm1d(64), nn.LeakyReLU(0.2), nn.Linear(64, 3))
    with torch.no_grad():  # statistics far from the layer's own: (x - mean) cancels
        net[1].running_mean.copy_(torch.randn(64) * 5)
        net[1].running_var.copy_(torch.rand(64) * 0.1 + 0.01)
    return net


@pytest.mark.parametrize("make", [lambda: nn.Sequential(nn.Linear(7, 256), nn.Tanh(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 3)),
                                  _SmallConvNet, _batch_normed], ids=["mlp", "cnn", "batchnorm"])
def test_the_rounding_bound_holds_for_a_float64_reference_and_is_not_vacuous(make):
    torch.manual_seed(0)
    net = make().eval()
    x = torch.randn(64, 2, 8, 8) if isinstance(net, _SmallConvNet) else torch.randn(64, 7) * 3
    values, bound = float32_error_bound(net, net, x)
    with torch.no_grad():
        exact = make().double().eval()
        exact.load_state_dict({k: v.double() if v.is_floating_point() else v for k, v in net.state_dict().items()})
        reference = exact(x.double())
    error = (values.double() - reference).abs()
    # One float32 evaluation is within half the bound (which covers two) of the exact value ...
    assert bool((error <= bound.double() / 2).all())
    # ... and the bound is far below the outputs' scale, so a wrong weight or input shows.
    assert float((bound / values.abs().clamp_min(1.0)).max()) < 1e-2
    assert float(error.max()) > 0  # float32 rounding is there to bound


def test_the_check_refuses_a_difference_beyond_rounding_and_allows_a_near_tie(tmp_path):
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3)).eval()
    x = torch.randn(32, 4)
    with torch.no_grad():
        y = net(x)
    _, bound = float32_error_bound(net, net, x)
    assert compare(tmp_path / "f", y + bound / 4, y, net, net, x)["max_abs_diff"] > 0
    with pytest.raises(EvalError, match="differs from the network by .* where float32 rounding allows"):
        compare(tmp_path / "f", y + 3 * bound, y, net, net, x)
    actions = y.argmax(dim=1)
    flipped = actions.clone()
    flipped[0] = (actions[0] + 1) % 3
    with pytest.raises(EvalError, match="other actions on 1 of 32 observations"):
        compare(tmp_path / "f", flipped, actions, net, net, x)
    # An exact tie (two equal outputs): either action is the network's.
    with torch.no_grad():
        net[2].weight[1] = net[2].weight[0]
        net[2].bias[1] = net[2].bias[0]
        tied = net(x).argmax(dim=1)
    other = torch.where(tied == 0, torch.ones_like(tied), torch.where(tied == 1, torch.zeros_like(tied), tied))
    assert compare(tmp_path / "f", other, tied, net, net, x)["near_ties"] == int((tied != 2).sum()) > 0


def test_onnx_without_its_packages_is_one_line_before_loading(make_cfg, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if not installed
    assert export_main([str(tmp_path / "no_such_run"), "format=onnx"]) == 2
    err = capsys.readouterr().err.strip()  # (onnx and onnxruntime named too where they are not installed either)
    assert err.startswith("error: format=onnx needs ") and err.endswith("onnxscript, not installed: pip install -e '.[onnx]'")
    assert "\n" not in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--format", "onnx"], "--format: options are key=value, e.g. format=onnx"),
    (["--out=m.onnx"], "--out=m.onnx: options are key=value, e.g. out=m.onnx"),
    (["format=tflite"], "format=tflite: format= takes torchscript or onnx"),
    (["weights=last"], "weights=last: weights= takes model or best"),
    (["color=red"], "color=red: unknown option"),
])
def test_export_options_are_one_line(tmp_path, capsys, argv, message):
    assert export_main([str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize("fmt", [pytest.param("onnx", marks=pytest.mark.slow), "torchscript"])
def test_the_exported_file_is_all_there_is_and_runs_copied_alone(make_cfg, tmp_path, fmt):
    """A user copies the one file: it must run from another folder with nothing beside it (an ONNX file left its
    weights in `policy.onnx.tmp.data` beside it, and failed in onnxruntime once copied alone)."""
    if fmt == "onnx":
        onnxruntime = onnxruntime_or_skip()
    run = made_run(make_cfg, tmp_path / "run", "ppo_pendulum", "model.hidden=[32,32]")
    before = set(p.name for p in run.iterdir())
    assert export_main([str(run), f"format={fmt}", "n=8"]) == 0
    name = "policy.onnx" if fmt == "onnx" else "policy.torchscript.pt"
    # Nothing beside it but its digest, which the store checks (a user may copy it or leave it).
    assert set(p.name for p in run.iterdir()) - before == {name, f"{name}.sha256"}
    from pipeline.store.integrity import verify_file

    assert verify_file(run / name) is not None
    (tmp_path / "elsewhere").mkdir()
    alone = shutil.copy(run / name, tmp_path / "elsewhere" / name)
    shutil.rmtree(run)
    obs = np.random.default_rng(0).uniform(-1, 1, size=(5, 3)).astype(np.float32)
    if fmt == "onnx":
        [actions] = onnxruntime.InferenceSession(str(alone), providers=["CPUExecutionProvider"]).run(None, {"obs": obs})
    else:
        with torch.no_grad():
            actions = torch.jit.load(str(alone))(torch.from_numpy(obs)).numpy()
    assert actions.shape == (5, 1) and np.isfinite(actions).all() and (np.abs(actions) <= 2).all()


def test_the_check_loads_the_file_copied_alone_so_a_file_that_needs_a_neighbour_is_refused(tmp_path):
    """The export's own check runs the file from an empty folder: an ONNX file whose weights live in a file beside
    it (what torch.onnx writes by default) passes in place but is refused by the check."""
    onnx = pytest.importorskip("onnx", reason=ONNX_REASON)
    onnxruntime_or_skip()
    from pipeline.export import run_alone, write_onnx

    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).eval()
    x = torch.randn(4, 3)
    write_onnx(net, x, tmp_path / "whole.onnx", ("obs", "out"))
    assert run_alone(tmp_path / "whole.onnx", "whole.onnx", lambda p: onnx.load(str(p))) is not None
    model = onnx.load(str(tmp_path / "whole.onnx"))
    onnx.save_model(model, str(tmp_path / "split.onnx"), save_as_external_data=True, location="split.onnx.data",
                    size_threshold=0)
    import onnxruntime

    onnxruntime.InferenceSession(str(tmp_path / "split.onnx"), providers=["CPUExecutionProvider"])  # loads in place
    with pytest.raises(EvalError, match=r"^split.onnx: the exported file does not load on its own \(copied alone"):
        run_alone(tmp_path / "split.onnx", "split.onnx",
                  lambda p: onnxruntime.InferenceSession(str(p), providers=["CPUExecutionProvider"]))


def test_out_an_existing_dir_writes_the_usual_name_into_it(make_cfg, tmp_path, capsys):
    run = made_run(make_cfg, tmp_path / "run", "dqn_cartpole", "model.hidden=[16]")
    (tmp_path / "exports").mkdir()
    assert export_main([str(run), f"out={tmp_path / 'exports'}", "n=4"]) == 0  # was: a 14-line IsADirectoryError
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"wrote {tmp_path / 'exports' / 'policy.torchscript.pt'} (TorchScript policy") and "\n" not in out
    assert sorted(p.name for p in (tmp_path / "exports").iterdir()) == ["policy.torchscript.pt", "policy.torchscript.pt.sha256"]


@pytest.fixture
def read_only_made_run(make_cfg, tmp_path):
    """A run dir on a read-only file system (tmpfs remounted read-only: root ignores file modes)."""
    import subprocess

    made = made_run(make_cfg, tmp_path / "made", "dqn_cartpole", "model.hidden=[16]")
    mount = tmp_path / "mnt"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("a read-only file system needs root and mount (tmpfs) here")
    try:
        shutil.copytree(made, mount / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        yield mount / "run"
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_export_to_a_read_only_run_dir_is_one_line_and_out_writes_elsewhere(read_only_made_run, tmp_path, capsys):
    assert export_main([str(read_only_made_run), "n=4"]) == 2  # was: a 27-line traceback
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (f"error: cannot write into {read_only_made_run}: the folder is not "
                                                   "writable; write it elsewhere with out=<file or dir>\n")
    assert export_main([str(read_only_made_run), "n=4", f"out={tmp_path / 'p.pt'}"]) == 0
    assert (tmp_path / "p.pt").is_file() and capsys.readouterr().out.startswith(f"wrote {tmp_path / 'p.pt'}")
