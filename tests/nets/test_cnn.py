import torch

from pipeline.nets.cnn import AtariCNN


def test_atari_cnn_takes_uint8_frames():
    net = AtariCNN(n_actions=6)
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    q = net(frames)
    assert q.shape == (2, 6) and q.dtype == torch.float32
    # Scaling happens inside: a float input already in [0, 1] would differ.
    assert torch.allclose(q, net(frames.float()))
    assert not torch.allclose(q, net(frames.float() / 255.0))
