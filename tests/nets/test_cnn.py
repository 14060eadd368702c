import torch

from pipeline.nets.cnn import AtariCNN


def test_atari_cnn_takes_uint8_frames():
    net = AtariCNN(out_features=6)
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    q = net(frames)
    assert q.shape == (2, 6) and q.dtype == torch.float32
    # Scaling happens inside: a float input already in [0, 1] would differ.
    assert torch.allclose(q, net(frames.float()))
    assert not torch.allclose(q, net(frames.float() / 255.0))


def test_frames_are_scaled_to_0_1_before_the_convolutions():
    torch.manual_seed(0)
    net = AtariCNN(out_features=3, in_channels=2)
    frames = torch.randint(0, 256, (2, 2, 84, 84), dtype=torch.uint8)
    reference = net.head(net.features(frames.float() / 255.0))
    assert torch.equal(net(frames), reference)
    assert [type(m).__name__ for m in net.features] == [
        "Conv2d",
        "ReLU",
        "Conv2d",
        "ReLU",
        "Conv2d",
        "ReLU",
        "Flatten",
    ]
    shapes = [
        (m.out_channels, m.kernel_size, m.stride) for m in net.features if isinstance(m, torch.nn.Conv2d)
    ]
    assert shapes == [(32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)), (64, (3, 3), (1, 1))]  # Mnih et al. 2015
    assert [type(m).__name__ for m in net.head] == ["Linear", "ReLU", "Linear"]
    assert [m.out_features for m in net.head if isinstance(m, torch.nn.Linear)] == [512, 3]
