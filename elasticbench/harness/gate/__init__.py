"""Regression gates: compare results files, decide pass or fail, A/B in one process, shards.

stats (ratios, intervals, tests) <- load (files -> costs and verdicts) <- compare (verdicts,
the gate's decision) -> render (text, Markdown). shard splits and merges matrices; ab times two
versions of a kernel interleaved; baseline keeps results files as committed baselines.
"""
