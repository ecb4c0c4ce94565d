"""mtpc: multi-token prediction with probabilistic circuits, and lossless self-speculative decoding."""
