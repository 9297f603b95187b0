"""Experiments built on the training and evaluation programs."""
