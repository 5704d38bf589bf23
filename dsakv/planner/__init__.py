"""The capacity planner: GPU catalogue, weights, workspaces, deployment, pool budget, prefix savings,
what-if variants, diagnosis and the composed ``plan``. Pure arithmetic on the spec; no torch."""
