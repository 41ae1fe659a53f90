"""Training: the loop, the step, the data loader, checkpoints, the JAX runtime and replay of
recorded intervals (``marin verify --segments``)."""
