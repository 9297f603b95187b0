"""What a trained encoder is measured and used by: features on the mesh and the kNN monitor,
the retrieval metrics, the linear probe, embeddings, hard negatives and their figures, the
PyTorch export."""
