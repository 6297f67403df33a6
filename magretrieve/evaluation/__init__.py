"""Evaluating vectors: exact search with a model's own similarity, ranking and STS metrics."""
