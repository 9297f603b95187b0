"""Contrastive training: the plan, state and step of a run, its epoch loop, and the pieces
only training uses (gradient caching, the negative queue, optimizers, multi-process start)."""
