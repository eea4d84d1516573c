#!/usr/bin/env bash
# The GPU checks behind results/gpu/, in one call on a machine with a CUDA GPU:
#
#     scripts/gpu_checks.sh OUTDIR [SECONDS]
#
# installs this checkout (no downloads: torch, Triton and the rest must be there), then runs,
# with the GPU's tests and the verification side by side (neither is timed) and the timed
# run alone afterwards:
#   elasticbench verify --backend triton -d fp32,fp16,bf16 --mode both   -> verify.json
#   pytest on the Triton tests and the torch ops' CUDA cases               -> log.txt
#   scripts/gpu_user_path.py (at most 240 s)                              -> user_path.json
#     (the user path: a training step under torch.cuda.set_sync_debug_mode("error"), a
#     whole step captured in a CUDA graph and replayed against eager, torch.compile with
#     fullgraph=True, and the public API, the modules and the raw Triton kernels timed beside
#     torch.softmax and SDPA; before the timed runs, as it matters more than they do)
#   scripts/train_step.py --compile both (at most 150 s)                  -> train_step.json
#     (one training step of a 4-layer, d_model 1024 causal transformer, B=8, L=2048, bf16,
#     with SDPA, ElasticAttention and flex_attention's Elastic, eager and compiled; the JSON
#     is rewritten after each variant, so a step cut off by its limit keeps what it timed)
#   elasticbench run --case cases/gpu.toml                                -> run.json
#   elasticbench run --case cases/gpu-bwd.toml (time permitting)         -> run_bwd.json
#   scripts/warm_cold.py triton_softmax torch_softmax (time permitting)   -> warm_cold.json
# Every step's output goes to OUTDIR/log.txt; the whole stays within SECONDS (default 540;
# 900 leaves room for every step),
# each step cut off by `timeout` where it would run past it.
set -u
out=${1:?usage: scripts/gpu_checks.sh OUTDIR [SECONDS]}
deadline=$(( $(date +%s) + ${2:-540} ))
mkdir -p "$out"
log="$out/log.txt"
export ELASTICBENCH_TORCH_DEVICE=cuda PYTHONUNBUFFERED=1 PYTHONWARNINGS="ignore:Editable installation"

left() { echo $(( deadline - $(date +%s) )); }

# step NAME LIMIT COMMAND...: run COMMAND for at most min(LIMIT, time left), its output in the log
step() {
    local name=$1 limit=$2 start rc
    shift 2
    (( limit > $(left) )) && limit=$(left)
    if (( limit < 10 )); then echo "== $name: skipped, $(left) s left" | tee -a "$log"; return; fi
    start=$(date +%s)
    echo "== $name (limit ${limit} s): $*" >>"$log"
    timeout "$limit" "$@" >"$out/$name.part" 2>&1
    rc=$?
    cat "$out/$name.part" >>"$log" && rm "$out/$name.part"
    echo "== $name: rc $rc in $(( $(date +%s) - start )) s" | tee -a "$log"
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
        --format=csv
    python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__,
        torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count, "SMs")'
    git log -1 --format='commit %H' 2>/dev/null
} >>"$log" 2>&1

step install 120 python3 -m pip install --quiet --no-deps --no-build-isolation --no-index -e .
step verify 300 elasticbench verify --backend triton -d fp32,fp16,bf16 --mode both \
    --json "$out/verify.json" &
# the torch ops' tests compare with the CPU's native tier, built first (verify needs none)
{ step native 120 python3 -m elasticbench.native
  step tests 300 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_triton.py \
      tests/test_triton_rows_params.py tests/test_triton_attention.py tests/test_torch_ops.py \
      tests/test_host_reads.py
} &
wait

# what users run first (the open targets), then the raw kernels' timings
step user_path 240 python3 scripts/gpu_user_path.py --budget "$(( $(left) < 240 ? $(left) - 10 : 230 ))" \
    --json "$out/user_path.json"
step train_step 150 python3 scripts/train_step.py --compile both --json "$out/train_step.json"
step run 300 elasticbench run --case cases/gpu.toml --json "$out/run.json"
step run_bwd 200 elasticbench run --case cases/gpu-bwd.toml --json "$out/run_bwd.json"
step warm_cold 120 python3 scripts/warm_cold.py triton_softmax torch_softmax \
    --json "$out/warm_cold.json"
echo "== done, $(left) s to spare" | tee -a "$log"
