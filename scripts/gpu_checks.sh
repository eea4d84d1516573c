#!/usr/bin/env bash
# The GPU checks in one call, on a bare machine with a CUDA GPU and a copy of this repository:
#
#     scripts/gpu_checks.sh OUT [SECONDS]      # SECONDS: 480 by default (one 8-minute call)
#     scripts/gpu_checks.sh --dry-run OUT      # every step's plumbing on this CPU, about 2 min
#
# Steps run in the order below (priority: the letters of issue 55's Build item 4). Each may
# run for its SHARE of SECONDS plus what the steps before it left unused, never past the
# deadline (a step with under 8 s left is skipped, one line); a step cut at its limit keeps
# every figure it wrote. The shares add up to 100.
#
# step        share  prio  what
STEPS=(
  "env           2   a   the machine: nvidia-smi, Python, every package (missing ones named), torch/CUDA/SMs, Triton, commit, the library's imports"
  "install       4   a   python3 -m pip install --no-deps --no-build-isolation --no-index -e . (a failure stops the run)"
  "api          10   a   one call of every public function and module of elasticbench.functional and .nn on CUDA, bf16, forward and backward"
  "right        13   b   every attention function and elastic_softmax/softmax/softmax1, fwd+bwd, fp32/fp16/bf16, causal, key padding, against the fp64 torch reference"
  "exact         5   b   elasticbench verify --backend triton --quick (the exact reference, the project's budgets) on elastic, softmax, elastic_attention"
  "user_path    12   c   scripts/gpu_user_path.py: a bf16 training step under sync debug mode error, CUDA-graph capture and replay, torch.compile fullgraph"
  "headline     16   d   scripts/gpu_headline.py: attention bf16 B=4 H=16 L=8192 D=128 beside cuDNN/flash SDPA and FlexAttention; ElasticSoftmax vs torch.softmax 4096x4096"
  "train_step    8   d   scripts/train_step.py --compile both: the transformer's training step, SDPA, ElasticAttention, FlexAttention"
  "rows_sweep    4   d   scripts/gpu_rows_sweep.py: the row kernels' share of the in-run copy bandwidth"
  "tune          8   e   elasticbench tune --out ... --budget ... (reported not available where the command is not there)"
  "verify       10   f   elasticbench verify --backend triton -d fp32,fp16,bf16 --mode both"
  "gpu_tests     4   f   pytest -m 'not ci' on the tests whose kernels run on CUDA (no interpreter suites)"
  "sweep         2   f   scripts/gpu_attention_sweep.py: the attention configurations, timed"
  "gates         2   f   scripts/gpu_gates.py: ab's false alarms and catches on the GPU"
)
#
# OUT gets at most five files (the device tool brings back eight): log.txt (every step's
# output, a header `== NAME: rc R in S s [status]` per step), figures.jsonl (one JSON object
# per figure, flushed as measured), summary.json and summary.md (each step's rc, seconds,
# limit, status) and gpu_checks.tar.gz (each step's own files: per-step JSON, verify
# records, the tuning table; rewritten after every step and on SIGTERM). Exit 0 when every
# step that ran passed, 1 when one failed or torch cannot reach a GPU, 2 for bad usage.
# The logic is scripts/gpu_checks.py's; results/gpu/README.md says how to read the files.
#
# The dry run sets TRITON_INTERPRET=1 and ELASTICBENCH_IMPLEMENTATION=triton, runs every
# step at tiny shapes on the CPU (the install step only checks that the package imports) and
# uses $GPU_CHECKS_PYTHON, else .venv/bin/python where it exists, else python3.
set -u
usage="usage: scripts/gpu_checks.sh [--dry-run] OUT [SECONDS]"
dry=()
if [[ ${1:-} == --dry-run ]]; then dry=(--dry-run); shift; fi
if [[ $# -lt 1 || $# -gt 2 || ${1:-} == -* ]]; then echo "$usage" >&2; exit 2; fi
out=$(realpath -m -- "$1")  # before the cd below: OUT is relative to where it was run
cd "$(dirname "$0")/.." || exit 2
if [[ ${#dry[@]} -gt 0 ]]; then total=${2:-175}; else total=${2:-480}; fi
if ! [[ $total =~ ^[0-9]+$ ]]; then echo "gpu_checks.sh: SECONDS must be a whole number, got '$total'" >&2; exit 2; fi
if [[ -n ${GPU_CHECKS_PYTHON:-} ]]; then py=$GPU_CHECKS_PYTHON
elif [[ ${#dry[@]} -gt 0 && -x .venv/bin/python ]]; then py=.venv/bin/python
else py=python3; fi
if ! command -v "$py" >/dev/null 2>&1; then echo "gpu_checks.sh: no Python here ($py)" >&2; exit 1; fi
step_args=()
for row in "${STEPS[@]}"; do step_args+=(--step "$row"); done
exec "$py" scripts/gpu_checks.py "$out" "$total" "${dry[@]}" --python "$py" "${step_args[@]}"
