"""Timing and rooflines: how fast each kernel runs and how close it gets to the machine's limits.

timing.py measures (CPU perf_counter_ns, GPU CUDA events), roofline.py measures the two
ceilings, models.py says what each kernel must move and compute, cases.py reads the [run]
table of a case file, peak_memory.py reads a call's peak resident memory, and runner.py (with
the run command's job) ties them together and emits one record per timed case.
"""
