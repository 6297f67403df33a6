"""Serving without torch: the exported ONNX graphs, the Retriever and bulk indexing."""
