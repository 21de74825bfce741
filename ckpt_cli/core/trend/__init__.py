"""``ckpt trend``: what happened to the weights across a run's steps (statistics per leaf and
step, updates between steps, the run's metrics and findings), read block by block."""
