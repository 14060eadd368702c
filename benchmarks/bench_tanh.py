"""torch.tanh against tanh's sigmoid form (2 sigmoid(2x) - 1) on float32 CPU tensors, and the form this machine picks.

    taskset -c 1 python benchmarks/bench_tanh.py
    MKL_ENABLE_INSTRUCTIONS=AVX2 taskset -c 1 python benchmarks/bench_tanh.py   # MKL's AVX2 kernel on an Intel CPU
    taskset -c 1 python benchmarks/bench_tanh.py --ppo-k 16 64    # + whole eager PPO iterations with each form

`pipeline.nets.mlp.Tanh` takes torch.tanh in eager wherever torch's tanh is MKL's AVX-512 kernel (an Intel CPU with
AVX-512, torch built with MKL, MKL not capped lower by MKL_CBWR / MKL_ENABLE_INSTRUCTIONS) and the sigmoid form for
large tensors elsewhere (`pipeline.nets.mlp.eager_tanh_form`). This prints what decides it here and, per size, the
CPU microseconds per call of both forms on one torch thread: without autograd (rollouts, evaluation) and forward +
backward (torch.tanh's own backward against `_SigmoidTanh`, the Function the module uses), the best of several
rounds of interleaved loops. A ratio above 1 in the last columns means torch.tanh is the faster one; where it is
below 1 on a machine that picks "tanh" (or above 1 on one that picks "sigmoid"), the rule is wrong there.
`--ppo-k` also times whole PPO iterations (benchmarks/bench_compile.py's PureJaxRL CartPole recipe, variant
eager-fused, K agents) with each form forced, alternating, and prints the median backpropagated samples per CPU
second of whole iterations (acting, env, update) of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from pipeline.nets import mlp


def sigmoid_form(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * 2).mul_(2).sub_(1)


def per_call_us(fn, calls: int) -> float:
    """CPU microseconds per call of `fn()` over `calls` calls (this process's CPU time: a loaded machine adds none)."""
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls * 1e6


def machine() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n\n")[0].splitlines()
    except OSError:
        lines = []
    info = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    avx512 = sorted(f for f in info.get("flags", "").split() if f in {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})
    caps = {k: os.environ[k] for k in ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS") if k in os.environ}
    return (f"cpu: {info.get('model name', '?')} ({info.get('vendor_id', '?')}), AVX-512 {' '.join(avx512) or 'none'}\n"
            f"torch {torch.__version__}, MKL {torch.backends.mkl.is_available()}, "
            f"ATen capability {torch.backends.cpu.get_cpu_capability()}, MKL env {caps or 'unset'}\n"
            f"chosen eager form for large float32 CPU tensors: {mlp.eager_tanh_form()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384, 65536, 524288])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ppo-k", type=int, nargs="*", default=[], help="also time PPO iterations at these K")
    parser.add_argument("--ppo-rounds", type=int, default=3)
    parser.add_argument("--values", type=float, default=2e7, help="values a loop touches: calls = values / size")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(machine())
    print(f"\nCPU us per call, one thread, best of {args.rounds} interleaved rounds")
    print(f"{'numel':>8} | {'no grad: tanh':>13} {'form':>8} {'form/tanh':>9} | "
          f"{'fwd+bwd: tanh':>13} {'form':>8} {'form/tanh':>9}")
    gen = torch.Generator().manual_seed(0)
    for n in args.sizes:
        x = torch.randn(n, generator=gen) * 3
        xg = x.clone().requires_grad_()
        up = torch.randn(n, generator=gen)
        cases = {
            "tanh": lambda x=x: torch.tanh(x),
            "form": lambda x=x: sigmoid_form(x),
            "tanh_grad": lambda xg=xg, up=up: torch.tanh(xg).backward(up),
            "form_grad": lambda xg=xg, up=up: mlp._SigmoidTanh.apply(xg).backward(up),
        }
        calls = max(10, int(args.values / n))
        best = dict.fromkeys(cases, float("inf"))
        with torch.no_grad():  # a warm-up of each, outside the timed rounds
            for name in ("tanh", "form"):
                per_call_us(cases[name], 10)
        per_call_us(cases["tanh_grad"], 10)
        per_call_us(cases["form_grad"], 10)
        for _ in range(args.rounds):
            for name, fn in cases.items():
                with torch.set_grad_enabled(name.endswith("_grad")):
                    best[name] = min(best[name], per_call_us(fn, calls))
            xg.grad = None
        print(f"{n:>8} | {best['tanh']:>13.1f} {best['form']:>8.1f} {best['form'] / best['tanh']:>9.2f} | "
              f"{best['tanh_grad']:>13.1f} {best['form_grad']:>8.1f} {best['form_grad'] / best['tanh_grad']:>9.2f}")

    for k in args.ppo_k:
        rate = ppo_samples_per_cpu_s(k, args.ppo_rounds)
        print(f"PPO K = {k}, eager, samples per CPU s (median of {args.ppo_rounds} alternating rounds): sigmoid form "
              f"{rate['sigmoid']:,.0f}, tanh {rate['tanh']:,.0f}: tanh/form {rate['tanh'] / rate['sigmoid']:.3f}")


def ppo_samples_per_cpu_s(k: int, rounds: int) -> dict[str, float]:
    """Median backpropagated samples per CPU s of steady eager PPO iterations with each tanh form forced."""
    import bench_compile  # benchmarks/ is on sys.path when this file is run as a script

    chosen, rates = mlp.eager_tanh_form, {"sigmoid": [], "tanh": []}
    try:
        for _ in range(rounds):
            for form, seen in rates.items():
                mlp.eager_tanh_form = lambda form=form: form
                seen.append(bench_compile.measure("ppo", k, "eager-fused", iterations=3)["samples_per_cpu_s"])
    finally:
        mlp.eager_tanh_form = chosen
    return {form: statistics.median(seen) for form, seen in rates.items()}


if __name__ == "__main__":
    main()
