#!/usr/bin/env bash
# The GPU checks behind results/gpu/, in one call on a machine with a CUDA GPU:
#
#     scripts/gpu_checks.sh OUTDIR [SECONDS]
#
# SECONDS (default 480: one device call of 8 minutes) is shared out between the steps: each
# may run for its share of SECONDS (below, in the order they run) and never past the time
# left, cut off by `timeout` (a timed run keeps the records it finished: --resume goes on);
# a step left with under 10 s is skipped, one line each. The shares add up to 96%; time a
# step does not use goes to the steps after it, and the last three take what is left.
#   install     5%  pip install -e . (no downloads: torch, Triton and the rest must be there)
#   verify     22%  elasticbench verify --backend triton -d fp32,fp16,bf16 --mode both
#                   -> verify.json; beside it, untimed too: the native tier's build, then
#                   pytest on the Triton tests, the torch ops' CUDA cases and the compiled
#                   FlexAttention composition against the composite -> log.txt
#   sweep      10%  scripts/gpu_attention_sweep.py, where it exists: every tuning
#                   configuration of the Triton attention kernel -> attention_sweep.json
#   attention  20%  elasticbench run --case cases/attention-gpu-headline.toml: SDPA (torch's
#                   choice, cuDNN, flash), FlexAttention's Elastic and the Triton kernel,
#                   bf16 B=4 H=16 D=128 L=8192, fwd and bwd -> attention_headline.json
#   gates       9%  scripts/gpu_gates.py: ab's A/A false alarms and planted-10% catches,
#                   20 trials each while its share lasts -> gates.json
#   user_path   8%  scripts/gpu_user_path.py: a training step under sync debug mode, CUDA
#                   graphs, torch.compile fullgraph, the public API against the raw kernels
#                   -> user_path.json
#   train_step  8%  scripts/train_step.py --compile both: one step of a 4-layer causal
#                   transformer, B=8, L=2048, bf16, with SDPA, ElasticAttention and the
#                   FlexAttention composition (JSON rewritten per variant) -> train_step.json
#   run         7%  elasticbench run --case cases/gpu.toml (the row kernels) -> run.json
#   rows_sweep  7%  scripts/gpu_rows_sweep.py: the row kernels under every launch plan
#                   against the in-run copy, the figures behind plan_rows' table
#                   -> rows-sweep.json
#   then, in what is left: run --case cases/gpu-bwd.toml -> run_bwd.json;
#   scripts/warm_cold.py -> warm_cold.json; the whole attention table,
#   cases/attention-gpu.toml -> attention.json (288 units: --resume it in later calls).
# Every step's output goes to OUTDIR/log.txt. Without a CUDA GPU (python3 cannot see one)
# nothing is installed or run: each step says it is skipped, in one line.
set -u
out=${1:?usage: scripts/gpu_checks.sh OUTDIR [SECONDS]}
total=${2:-480}
start_all=$(date +%s)
deadline=$(( start_all + total ))
mkdir -p "$out"
log="$out/log.txt"
export ELASTICBENCH_TORCH_DEVICE=cuda PYTHONUNBUFFERED=1 PYTHONWARNINGS="ignore:Editable installation"

left() { echo $(( deadline - $(date +%s) )); }
# share PCT: PCT of SECONDS, in seconds, but never more than is left
share() { local s=$(( total * $1 / 100 )) l; l=$(left); echo $(( s < l ? s : l )); }
# inner LIMIT MARGIN: the budget a script with its own --budget gets inside its step's limit
inner() { echo $(( $1 - $2 > 1 ? $1 - $2 : 1 )); }

gpu=$(python3 -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
no_gpu=""
[[ $gpu == 1 ]] || no_gpu="no CUDA GPU here (python3 sees none)"

# step NAME LIMIT COMMAND...: run COMMAND for at most min(LIMIT, time left), its output in the log
step() {
    local name=$1 limit=$2 start rc
    shift 2
    if [[ -n $no_gpu ]]; then echo "== $name: skipped, $no_gpu" | tee -a "$log"; return; fi
    (( limit > $(left) )) && limit=$(left)
    if (( limit < 10 )); then echo "== $name: skipped, $(left) s left" | tee -a "$log"; return; fi
    start=$(date +%s)
    echo "== $name (limit ${limit} s): $*" >>"$log"
    timeout "$limit" "$@" >"$out/$name.part" 2>&1
    rc=$?
    cat "$out/$name.part" >>"$log" && rm "$out/$name.part"
    echo "== $name: rc $rc in $(( $(date +%s) - start )) s" | tee -a "$log"
}

if [[ -z $no_gpu ]]; then
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
            --format=csv
        python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__,
            torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count, "SMs")'
        git log -1 --format='commit %H' 2>/dev/null
    } >>"$log" 2>&1
fi

step install "$(share 5)" python3 -m pip install --quiet --no-deps --no-build-isolation --no-index -e .
# the verification and the tests side by side (neither is timed), within one share
phase=$(share 22)
step verify "$phase" elasticbench verify --backend triton -d fp32,fp16,bf16 --mode both \
    --json "$out/verify.json" &
# the torch ops' tests compare with the CPU's native tier, built first (verify needs none)
{ phase_end=$(( $(date +%s) + phase ))
  step native "$phase" python3 -m elasticbench.native
  step tests "$(( phase_end - $(date +%s) ))" python3 -m pytest -q -n 8 -p no:cacheprovider \
      tests/test_triton.py tests/test_triton_rows_params.py tests/test_triton_resident.py \
      tests/test_triton_attention.py \
      tests/test_torch_ops.py tests/test_host_reads.py \
      "tests/test_flex_attention.py::test_the_compiled_cuda_composition_is_the_composite"
} &
wait

# issue 49's figures: the Triton attention kernel's tuning, then its table beside SDPA and
# FlexAttention, then the gates
if [[ -f scripts/gpu_attention_sweep.py ]]; then
    limit=$(share 10)
    step sweep "$limit" python3 scripts/gpu_attention_sweep.py --budget "$(inner "$limit" 15)" \
        --json "$out/attention_sweep.json"
else
    echo "== sweep: skipped, scripts/gpu_attention_sweep.py does not exist" | tee -a "$log"
fi
step attention "$(share 20)" elasticbench run --case cases/attention-gpu-headline.toml \
    --json "$out/attention_headline.json"
limit=$(share 9)
step gates "$limit" python3 scripts/gpu_gates.py --budget "$(inner "$limit" 15)" \
    --json "$out/gates.json"

# what users run, then the row kernels' timed runs
limit=$(share 8)
step user_path "$limit" python3 scripts/gpu_user_path.py --budget "$(inner "$limit" 10)" \
    --json "$out/user_path.json"
step train_step "$(share 8)" python3 scripts/train_step.py --compile both \
    --json "$out/train_step.json"
step run "$(share 7)" elasticbench run --case cases/gpu.toml --json "$out/run.json"
limit=$(share 7)
step rows_sweep "$limit" python3 scripts/gpu_rows_sweep.py "$out" --budget-s "$(inner "$limit" 8)"

# time permitting
step run_bwd "$(left)" elasticbench run --case cases/gpu-bwd.toml --json "$out/run_bwd.json"
step warm_cold "$(left)" python3 scripts/warm_cold.py triton_softmax torch_softmax \
    --json "$out/warm_cold.json"
step attention_full "$(left)" elasticbench run --case cases/attention-gpu.toml \
    --json "$out/attention.json"
echo "== done in $(( $(date +%s) - start_all )) s of $total" | tee -a "$log"
