"""Ground truth: exact outputs per row (`row_truth`) and for attention (`attention_truth`,
`attention_oracle`: mpmath), and the cache that solves many at once (`cache`)."""
