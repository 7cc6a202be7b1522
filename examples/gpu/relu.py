"""The problem (KernelBench level1/19_ReLU's shape): Model is the reference, get_inputs() draws its inputs on the
GPU-sized shape, 4096 rows of 16384 floats (256 MiB)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(4096, 16384)]


def get_init_inputs():
    return []
