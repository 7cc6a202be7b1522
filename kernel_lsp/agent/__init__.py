"""The optimization agent: model client, tools, search tree, rubric, budgets and trajectories."""
