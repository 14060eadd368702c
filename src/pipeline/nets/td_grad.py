"""The TD-loss gradient of a ReLU ensemble MLP, written out by hand.

A DQN update on a small MLP is a dozen tiny kernels, and on a CPU the autograd engine's bookkeeping
around them (graph nodes, saved tensors, the backward pass's dispatch) costs about as much as the
arithmetic. For the plain Q-network (`model=mlp` with `act=relu` and no dropout: Linear -> ReLU -> ...
-> Linear, stacked as an `EnsembleMLP`) and the two TD losses DQN offers (SmoothL1 / Huber and MSE),
the gradient is short enough to write out: the forward pass keeps each layer's ReLU output, the
loss's derivative is scattered into the taken actions' Q-values, and each layer's weight, bias and
input gradients are one `bmm`, one sum and one `threshold_backward` (the kernel autograd runs for a
ReLU). Measured on one CPU thread (batch 64): one update 0.61x autograd's time at K = 1 (128-128),
0.83x at K = 16 and 0.67x at K = 64 (96-96). The gradients equal autograd's (tests/nets/test_td_grad.py):
same kernels, same order, so each agent still gets exactly its own gradient (loss mean over its batch,
summed over agents).

Anything else (dueling, noisy, CNN, other activations or losses) keeps autograd: `relu_mlp_layers`
returns None for it.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.nets.ensemble import EnsembleLinear, EnsembleMLP


def relu_mlp_layers(net: nn.Module) -> list[EnsembleLinear] | None:
    """The linear layers of `net` when it is an EnsembleMLP of Linear -> ReLU -> ... -> Linear with biases, else None."""
    if type(net) is not EnsembleMLP:
        return None
    modules = list(net.net)
    linears, relus = modules[0::2], modules[1::2]
    if len(modules) % 2 == 0 or not all(type(m) is EnsembleLinear and m.bias is not None for m in linears):
        return None
    if not all(type(m) is nn.ReLU for m in relus):
        return None
    return linears


def loss_derivative(loss: nn.Module) -> float | None:
    """How d(loss)/d(q) is formed: the Huber/SmoothL1 beta (> 0), 0.0 for MSE; None when not written out here."""
    if type(loss) is nn.SmoothL1Loss and loss.beta > 0:
        return float(loss.beta)
    if type(loss) is nn.MSELoss:
        return 0.0
    return None


# Rows of a no-grad forward per chunk: about this many hidden activations at a time (K x rows x width),
# small enough to stay in cache. One [64, 2048, 96] activation (a round's TD targets at K = 64) is 50 MB:
# allocating, faulting in and streaming it cost 3-4x the chunked forward's time (measured 129 vs 33 ms).
CHUNK_ELEMENTS = 1 << 18


@torch.no_grad()
def relu_mlp_forward(layers: list[EnsembleLinear], x: torch.Tensor) -> torch.Tensor:
    """The network's output for x [K, N, F] without autograd: in-place ReLUs, on a CPU N split into cache-sized chunks.

    On a GPU the whole batch goes at once (chunks there would only multiply kernel launches).
    """
    x = x.flatten(2) if x.dim() > 3 else x
    width = max(layer.out_features for layer in layers)
    rows = max(1, CHUNK_ELEMENTS // (x.shape[0] * width)) if x.device.type == "cpu" else x.shape[1]
    outputs = []
    for chunk in x.split(rows, dim=1):
        for layer in layers[:-1]:
            chunk = torch.baddbmm(layer.bias, chunk, layer.weight).relu_()
        outputs.append(torch.baddbmm(layers[-1].bias, chunk, layers[-1].weight))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


@torch.no_grad()
def td_grads_(
    layers: list[EnsembleLinear], obs: torch.Tensor, actions: torch.Tensor, target: torch.Tensor, beta: float
) -> torch.Tensor:
    """Set each layer's `.grad` to the gradient of sum_k mean_n loss(Q_k(obs)[n, a], target[k, n]).

    obs [K, N, F], actions [K, N] (int64), target [K, N]; `beta` from `loss_derivative` (0.0 = MSE).
    Returns the taken actions' Q-values [K, N] (for the loss value and logging).
    """
    x = obs.flatten(2) if obs.dim() > 3 else obs
    inputs = [x]
    for layer in layers[:-1]:
        x = torch.relu(torch.baddbmm(layer.bias, x, layer.weight))
        inputs.append(x)
    last = layers[-1]
    q = torch.baddbmm(last.bias, x, last.weight)
    index = actions.unsqueeze(2)
    taken = q.gather(2, index).squeeze(2)
    n = taken.shape[1]
    diff = taken - target
    if beta > 0:  # SmoothL1: d/beta inside [-beta, beta], its sign outside
        dloss = (diff / beta).clamp_(-1.0, 1.0).div_(n)
    else:  # MSE: 2 d
        dloss = diff.mul_(2.0 / n)
    grad = torch.zeros_like(q).scatter_(2, index, dloss.unsqueeze(2))
    for i in range(len(layers) - 1, -1, -1):
        layer, x = layers[i], inputs[i]
        layer.weight.grad = torch.bmm(x.transpose(1, 2), grad)
        layer.bias.grad = grad.sum(1, keepdim=True)
        if i:
            grad = torch.ops.aten.threshold_backward(torch.bmm(grad, layer.weight.transpose(1, 2)), x, 0)
    return taken
