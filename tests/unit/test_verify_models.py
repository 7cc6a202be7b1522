"""The reference's weights reach the candidate where names and shapes match; else both rely on the same seed."""

from __future__ import annotations

import torch
import torch.nn as nn

from kernel_lsp.candidate.models import load_weights


class Reference(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))


def test_matching_names_and_shapes_are_loaded_the_rest_kept():
    reference = Reference()
    candidate = Reference()
    candidate.scale = nn.Parameter(torch.zeros(5))  # same name, other shape: not loaded
    assert load_weights(reference.state_dict(), candidate) == "state_dict: 2 of 3 tensors loaded"
    assert torch.equal(candidate.linear.weight, reference.linear.weight)
    assert torch.equal(candidate.scale, torch.zeros(5))


def test_no_common_names_falls_back_to_the_seed_and_no_weights_is_said():
    assert load_weights(Reference().state_dict(), nn.Sequential(nn.Linear(4, 4))).startswith("same seed for both")
    assert load_weights(nn.ReLU().state_dict(), nn.ReLU()) == "no weights"
