"""Ground truth: exact outputs per row (`rows`) and for attention (`attention`,
`attention_oracle`: mpmath), and the cache that solves many at once (`cache`)."""
