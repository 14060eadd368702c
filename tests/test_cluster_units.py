"""runtime/cluster.py: what a SLURM sweep checks before it submits, against sbatch/scontrol/sinfo stood in for."""

from __future__ import annotations

import subprocess

import pytest

from pipeline.config.checks import ConfigError
from pipeline.runtime import cluster

SINFO = "debug* (null)\ngpu gpu:a100:4\ncpu2 (null)\n"


class FakeSlurm:
    """subprocess.run for scontrol/sinfo: records each call and answers as a cluster would."""

    def __init__(self, ping=("Slurmctld(primary) at head is UP\n", "", 0), sinfo=SINFO, ping_timeout=False):
        self.ping, self.sinfo, self.ping_timeout = ping, sinfo, ping_timeout
        self.calls: list[tuple[list[str], dict]] = []

    def __call__(self, args, **kwargs):
        self.calls.append((args, kwargs))
        if args[0] == "scontrol":
            if self.ping_timeout:
                raise subprocess.TimeoutExpired(args, kwargs.get("timeout"))
            out, err, rc = self.ping
            return subprocess.CompletedProcess(args, rc, out, err)
        assert args[0] == "sinfo"
        return subprocess.CompletedProcess(args, 0, self.sinfo, "")


@pytest.fixture
def slurm(monkeypatch):
    def install(**kwargs) -> FakeSlurm:
        fake = FakeSlurm(**kwargs)
        monkeypatch.setattr(cluster.shutil, "which", lambda name: "/usr/bin/sbatch" if name == "sbatch" else None)
        monkeypatch.setattr(cluster.subprocess, "run", fake)
        return fake

    return install


def refusal(params, accelerator=None) -> str:
    with pytest.raises(ConfigError) as info:
        cluster.check_slurm_submission(params, accelerator)
    return str(info.value)


def test_a_working_cluster_passes_and_is_asked_with_text_output_and_a_timeout(slurm):
    fake = slurm()
    assert cluster.check_slurm_submission({}, "cpu") is None
    assert [args for args, _ in fake.calls] == [["scontrol", "ping"], ["sinfo", "-h", "-o", "%P %G"]]
    for _, kwargs in fake.calls:
        assert kwargs == {"capture_output": True, "text": True, "timeout": 20}


def test_without_sbatch_on_path_the_line_says_where_to_run(monkeypatch):
    seen = []
    monkeypatch.setattr(cluster.shutil, "which", lambda name: seen.append(name))
    monkeypatch.setattr(cluster.subprocess, "run", lambda *a, **k: pytest.fail("nothing runs without sbatch"))
    assert refusal({}) == ("hydra/launcher=slurm needs SLURM's sbatch on PATH: run the sweep on the cluster's login "
                           "node (or hydra/launcher=joblib on this machine)")
    assert seen == ["sbatch"]


DOWN = ("the SLURM controller is not answering (scontrol ping: {}): start slurmctld (make cluster-up for the local "
        "test cluster) or ask the cluster's admins")


@pytest.mark.parametrize(("ping", "said"), [
    (("Slurmctld(primary) at head is DOWN\nmore\n", "", 0), "Slurmctld(primary) at head is DOWN"),
    (("", "  scontrol: error: cannot connect\nsecond\n", 1), "scontrol: error: cannot connect"),
    (("Slurmctld(primary) at head is UP\n", "", 1), "Slurmctld(primary) at head is UP"),
    (("  \n", "", 1), "no answer"),
    (("", "", 0), "no answer"),
])
def test_a_controller_that_is_not_up_is_one_line_with_its_first_words(slurm, ping, said):
    fake = slurm(ping=ping)
    assert refusal({}) == DOWN.format(said)
    assert len(fake.calls) == 1  # sinfo is not asked


def test_a_ping_that_times_out_says_no_answer(slurm):
    slurm(ping_timeout=True)
    assert refusal({}) == DOWN.format("no answer")


def test_an_unknown_partition_lists_the_partitions_sorted(slurm):
    slurm()
    assert refusal({"partition": "gpus"}) == ("SLURM partition 'gpus' does not exist here; partitions: cpu2, debug, gpu "
                                              "(hydra.launcher.partition=<one of them>)")


def test_an_unknown_partition_on_a_cluster_without_partitions_says_none(slurm):
    slurm(sinfo="\n")
    assert refusal({"partition": "gpu"}) == ("SLURM partition 'gpu' does not exist here; partitions: none "
                                             "(hydra.launcher.partition=<one of them>)")


@pytest.mark.parametrize("partition", ["debug", "gpu", "cpu2"])
def test_a_known_partition_passes_on_cpu(slurm, partition):
    slurm()
    cluster.check_slurm_submission({"partition": partition}, "cpu")


@pytest.mark.parametrize("accelerator", ["cuda", "GPU", "Cuda"])
def test_a_gpu_run_without_gpus_per_node_is_refused(slurm, accelerator):
    slurm()
    expected = ("device=cuda on SLURM needs a GPU per job: add hydra.launcher.gpus_per_node=1 (and a partition with "
                "GPUs), or use device=cpu")
    assert refusal({"partition": "gpu"}, accelerator) == expected
    assert refusal({"partition": "gpu", "gpus_per_node": 0}, accelerator) == expected


@pytest.mark.parametrize("accelerator", [None, "cpu", "mps", "auto"])
def test_a_run_that_is_not_on_gpu_needs_no_gpus(slurm, accelerator):
    slurm()
    cluster.check_slurm_submission({"partition": "debug"}, accelerator)


def test_a_gpu_run_on_the_default_partition_without_gres_is_refused(slurm):
    slurm()
    assert refusal({"gpus_per_node": 1}, "cuda") == (
        "device=cuda, but SLURM partition 'debug' has no GPUs (Gres (null)): choose a GPU partition with "
        "hydra.launcher.partition=..., or use device=cpu")


def test_a_gpu_run_on_a_named_partition_without_gres_is_refused(slurm):
    slurm(sinfo="debug* gpu:1\ncpu\n")  # a partition line without a Gres column reads as (null)
    assert refusal({"partition": "cpu", "gpus_per_node": 1}, "gpu") == (
        "device=cuda, but SLURM partition 'cpu' has no GPUs (Gres (null)): choose a GPU partition with "
        "hydra.launcher.partition=..., or use device=cpu")


def test_a_gpu_run_on_a_gpu_partition_passes(slurm):
    slurm()
    cluster.check_slurm_submission({"partition": "gpu", "gpus_per_node": 2}, "cuda")
    slurm(sinfo="gpu* gpu:a100:4\ncpu (null)\n")
    cluster.check_slurm_submission({"gpus_per_node": 1}, "cuda")  # the default partition, marked with *


def test_without_a_default_partition_a_gpu_run_is_not_checked_against_one(slurm):
    slurm(sinfo="cpu (null)\nother (null)\n")
    cluster.check_slurm_submission({"gpus_per_node": 1}, "cuda")  # SLURM itself picks; nothing to compare


def test_the_default_partition_is_the_first_starred_one(slurm):
    slurm(sinfo="cpu (null)\ngpu* gpu:2\ncpu2* (null)\n")
    cluster.check_slurm_submission({"gpus_per_node": 1}, "cuda")  # gpu*, not cpu2*


def test_only_the_default_star_is_cut_from_partition_names(slurm):
    slurm(sinfo="BOX* gpu:1\nTAX (null)\n")  # names ending in other characters keep them
    cluster.check_slurm_submission({"gpus_per_node": 1}, "cuda")  # BOX, the default, has GPUs
    cluster.check_slurm_submission({"partition": "TAX"}, "cpu")
    assert refusal({"partition": "TA"}) == ("SLURM partition 'TA' does not exist here; partitions: BOX, TAX "
                                            "(hydra.launcher.partition=<one of them>)")
    slurm(sinfo="TAX* (null)\nBOX gpu:1\n")
    assert refusal({"gpus_per_node": 1}, "cuda") == (
        "device=cuda, but SLURM partition 'TAX' has no GPUs (Gres (null)): choose a GPU partition with "
        "hydra.launcher.partition=..., or use device=cpu")
