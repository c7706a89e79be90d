"""χ² on counts of (first, second) token pairs, with rare cells pooled."""

import torch
from scipy.stats import chisquare


def pooled_chisquare(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """The χ² p-value of observed counts against expected ones (both flat, same total), after pooling
    the cells that expect fewer than 5 into one, folded into the largest cell when it is still below 5."""
    frequent = expected >= 5
    rare = (expected < 5) & (expected > 0)
    exp_cells = torch.cat([expected[frequent], expected[rare].sum().view(1)])
    obs_cells = torch.cat([observed[frequent], observed[rare].sum().view(1)])
    if exp_cells[-1] < 5:  # too little pooled mass to test on its own: fold it into the largest cell
        exp_cells[0] += exp_cells[-1]
        obs_cells[0] += obs_cells[-1]
        exp_cells, obs_cells = exp_cells[:-1], obs_cells[:-1]
    return chisquare(obs_cells.numpy(), exp_cells.numpy()).pvalue
