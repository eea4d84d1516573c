"""Floating-point formats, ulp error, error budgets and the mpmath ground truth."""
