"""`elasticbench hunt`: a search for an input that breaks a kernel, bounded in time.

The search space (space.py) is what the default matrix samples sparsely: shapes (column and
row counts near the powers of two where kernels switch paths), input layouts, parameters
over their whole span, mixes of the adversarial generators, and single extreme values. A
search (search.py) explores it at random and steers toward configurations that use a larger
share of the error budget; a failure is shrunk (shrink.py) to a small reproducer and saved
as a case file (reproducer.py) that `elasticbench verify --case FILE` replays. Every
configuration tried is a verify record of the hunt's results file.
"""
