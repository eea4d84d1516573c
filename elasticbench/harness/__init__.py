"""The harness: what judges kernels, the library's own among them.

The command line (`cli`), the kinds of kernel it asks for a job (`kinds`), verification,
timing, hunting, self-tests, gates and reports, the exact reference (`functions`, `numerics`),
the adversarial inputs and the registry of kernels with its built-in registrations
(`builtin`). The library (elasticbench.functional, elasticbench.nn and what they run) never
imports anything from here; docs/architecture.md draws the layers.
"""
