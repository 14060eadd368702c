"""Pick the accelerator, the CPU thread count and the CPU heap from the `device` config group; start a run's other
ranks on this machine (trainer=ddp)."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch

log = logging.getLogger(__name__)


class DeviceError(RuntimeError):
    pass


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def resolve_accelerator(requested: str) -> str:
    """Map `auto` to cuda, then mps, then cpu; check that an explicit request can be met."""
    requested = str(requested).lower()
    if requested == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if _mps_available() else "cpu"
    if requested in ("cuda", "gpu"):
        if not torch.cuda.is_available():
            raise DeviceError("device=cuda was requested but torch sees no CUDA GPU; use device=cpu or device=auto")
        return "cuda"
    if requested == "mps":
        if not _mps_available():
            raise DeviceError("device=mps was requested but MPS is not available; use device=cpu or device=auto")
        return "mps"
    if requested == "cpu":
        return "cpu"
    raise DeviceError(f"unknown device.accelerator {requested!r}; choose auto, cpu, cuda or mps")


def flushes_denormals() -> bool:
    """Whether CPU arithmetic flushes denormal floats to zero right now (torch has a setter, no getter)."""
    return torch.tensor([1e-39], dtype=torch.float32).mul(1.0).item() == 0.0


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_cpu_heap(mb: int | None) -> bool:
    """Serve CPU allocations below `mb` MiB from glibc's heap and keep up to 4x that freed at its top.

    glibc serves blocks above its (adaptive, 128 KiB-based) threshold with a fresh mmap and unmaps them on free,
    so a tensor of a few MiB made and dropped every step costs a page fault per 4 KiB each time: in a K = 16 PPO
    update ([16, 256, 64] activations, 1 MiB each; tests/test_devices.py's pattern: 258-2,534 faults a step, 31
    with the kept heap), and the run learned ~8% faster (at K = 1, whose tensors are small, ~3%). The cost: up to 4 x `mb`
    MiB of freed memory stays mapped. Returns whether it was applied (False: `mb` unset, or not glibc).
    """
    if mb is None or int(mb) <= 0:
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        log.debug("device.cpu_heap_mb: this C library has no mallopt; left as it is")
        return False
    size = int(mb) << 20
    applied = bool(mallopt(_M_MMAP_THRESHOLD, size)) and bool(mallopt(_M_TRIM_THRESHOLD, 4 * size))
    if not applied:
        log.warning(f"device.cpu_heap_mb={mb}: the C library refused it; glibc's own thresholds stay")
    return applied


def setup_device(
    accelerator: str, num_threads: int | None, flush_denormal: bool = True, cpu_heap_mb: int | None = None
) -> torch.device:
    """Resolve the accelerator, apply the CPU thread count, denormal flushing and the CPU heap, and say what was picked."""
    name = resolve_accelerator(accelerator)
    if num_threads is not None and int(num_threads) > 0:
        # With more threads than free cores a tiny network steps several times slower.
        torch.set_num_threads(int(num_threads))
    # Denormal floats (|x| < 1.2e-38) take a slow path in CPU arithmetic. Adam's second moments of
    # gradients that are zero or tiny decay into that range: in a K = 64 DQN run the fused Adam step
    # took 3.7 ms instead of 0.5 ms, and flushing them to zero cut the run's learning time by 39%.
    torch.set_flush_denormal(bool(flush_denormal))
    keep_cpu_heap(cpu_heap_mb)
    detail = torch.cuda.get_device_name(0) if name == "cuda" else f"{torch.get_num_threads()} CPU thread(s)"
    log.info(f"device: {name} ({detail})")
    return torch.device(name)


# ---- one run on several processes (trainer=ddp) ------------------------------------------------------------------
# Lightning's environment variables that make a process one rank of a run; the launching rank restores them after.
_RANK_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


def _ddp_classes():
    """Lightning's DDP strategy and script launcher, specialised (imported on first use: the CLI's checks stay light)."""
    from lightning.pytorch.strategies import DDPStrategy
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

    class RankLauncher(_SubprocessScriptLauncher):
        """Starts ranks 1..N-1 on this machine as `python -m pipeline.runtime.job --rank <dir>` from the run's composed
        config (Lightning's launcher re-runs the command line, which would take the run dir's lock and write into it).
        Without Lightning's watcher, which SIGKILLs this process when a rank dies: the collective that rank leaves
        fails (or times out), and the run's record says which rank ended and how (`RankProcesses.failure`)."""

        def __init__(self, environment, num_processes: int, num_nodes: int, ranks: RankProcesses) -> None:
            super().__init__(environment, num_processes, num_nodes)
            self.ranks = ranks

        def launch(self, function, *args, trainer=None, **kwargs):
            self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
            if not self.cluster_environment.creates_processes_externally:
                self._call_children_scripts()
            return function(*args, **kwargs)

        def _call_children_scripts(self) -> None:
            self._check_can_spawn_children()
            env = self.cluster_environment
            os.environ.update(MASTER_ADDR=env.main_address, MASTER_PORT=str(env.main_port), NODE_RANK=str(env.node_rank()),
                              LOCAL_RANK="0", WORLD_SIZE=str(self.num_processes * self.num_nodes))
            self.procs = [self.ranks.start(local_rank) for local_rank in range(1, self.num_processes)]

    class RankStrategy(DDPStrategy):
        """DDP whose local ranks are started by `RankLauncher` (SLURM's tasks start themselves)."""

        def __init__(self, ranks: RankProcesses | None, **kwargs) -> None:
            super().__init__(**kwargs)
            self.ranks = ranks

        def _configure_launcher(self) -> None:
            if self.cluster_environment.creates_processes_externally or self.ranks is None:
                super()._configure_launcher()
            else:
                self._launcher = RankLauncher(self.cluster_environment, self.num_processes, self.num_nodes, self.ranks)

    return RankStrategy


class RankFailed(RuntimeError):
    """Another rank of the run ended (or stopped answering) while this one waited for it."""


class RankProcesses:
    """The ranks this process (rank 0) starts on this machine, and what became of them.

    Each rank gets `job_dir`'s config.yaml and context.json (a temporary folder, outside the run dir) and writes its
    error line to `rank<r>.error` there if it fails; `close()` waits for the ranks (killing what is left after
    `wait_s`), removes the folder and gives this process its environment back (a later run in it starts afresh).
    """

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = Path(job_dir)
        self.procs: dict[int, subprocess.Popen] = {}
        self._env = {k: os.environ.get(k) for k in _RANK_ENV}

    def start(self, local_rank: int) -> subprocess.Popen:
        env = {**os.environ, "LOCAL_RANK": str(local_rank)}
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.runtime.job", "--rank", str(self.job_dir)], env=env)
        self.procs[local_rank] = proc
        return proc

    def failure(self, exc: BaseException) -> BaseException:
        """The run's failure as the rank that caused it: a rank that ended, with its exit and its error line."""
        deadline = time.monotonic() + 5.0  # a rank whose sockets just closed may still be exiting
        while time.monotonic() < deadline and not any(p.poll() not in (None, 0) for p in self.procs.values()):
            time.sleep(0.1)
        for rank, proc in sorted(self.procs.items()):
            code = proc.poll()
            if code in (None, 0):
                continue
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            error = self.job_dir / f"rank{rank}.error"
            said = f": {error.read_text().strip()}" if error.is_file() else ""
            return RankFailed(f"rank {rank} (pid {proc.pid}) {how}{said}")
        if "timed out" in str(exc).lower():  # a rank that hangs (stopped, deadlocked) rather than ended
            alive = ", ".join(f"rank {r} (pid {p.pid})" for r, p in sorted(self.procs.items()))
            return RankFailed(f"{alive} did not answer within trainer.ddp_timeout_s: {str(exc).strip().splitlines()[0]}")
        return exc

    def close(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        for rank, proc in sorted(self.procs.items()):
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.info(f"rank {rank} (pid {proc.pid}) ended with exit code {proc.returncode}")
        shutil.rmtree(self.job_dir, ignore_errors=True)
        for key, value in self._env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def ddp_strategy(ranks: RankProcesses | None, timeout_s: float, unused_parameters: bool = False):
    """The Trainer's strategy for one run on several processes: gloo on CPU, nccl on CUDA (Lightning's choice), a rank
    that waits longer than `timeout_s` for the others fails. `ranks`: the local ranks this process starts (rank 0 on
    one machine); None where the processes exist already (the other ranks, SLURM's tasks). `unused_parameters`: DDP
    looks for parameters a backward pass leaves without a gradient (`Task.ddp_unused_parameters`)."""
    return _ddp_classes()(ranks, timeout=timedelta(seconds=float(timeout_s)), find_unused_parameters=unused_parameters)
