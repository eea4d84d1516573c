"""The attention kind's harness parts (kernels that take q, k, v; docs/attention.md), together:

- `attention_kind.py`: the attention Kind the commands ask for a job (kinds/__init__.py lists it);
- `kernel_contract.py`: how `verify` and `run` call a registered attention kernel;
- `qkv_inputs.py`: the adversarial inputs, q, k and v drawn together (masks and gates too);
- `verify_matrix.py`: the [attention_verify] table of a case file and the cases it expands to;
- `verify_job.py`: verifying attention kernels: the call, the truth, the record, the job;
- `scoring.py`: an output or gradient scored against the exact truth, in ulps and by the
  special-value policy;
- `gating.py`: gated cases: the gate a case gives, who is given it, how it is judged;
- `run_case.py`: the [attention_run] table of a case file;
- `run_job.py`: timing attention kernels against SDPA and the copy and matmul ceilings;
- `mutant_kernels.py`: deliberately wrong attention kernels the self-test must catch, and
  its run.

Elsewhere, each beside its own kind of thing: the definitions
(functions/attention_functions.py), the exact reference (numerics/truth/, numerics/budgets/,
numerics/certified/), the built-in registrations (builtin/*_attention.py) and the compile
audit (audit/attention_*.py).

This module imports nothing, so that importing one part loads only what that part needs.
"""
