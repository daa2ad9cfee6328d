#!/usr/bin/env bash
# Issue 16's GPU runs through the device tool, results and logs under $OUT. Stages, in the order given:
#   bash scripts/gpu_run.sh tests alibi     # python -m pytest -m gpu; scripts/bench_alibi.py
#   bash scripts/gpu_run.sh eval rope extension   # bench_eval.py, bench_rope_overhead.py, bench_extension.py
#   bash scripts/gpu_run.sh position-wise         # bench_position_wise.py
# A task lent a GPU has 15 minutes of device time, start-up included: one call (timeout_s 590; each stage has
# its own timeout below, and the stages of one call must fit in it). Run the stages not measured since the last
# changes first: `bash scripts/gpu_run.sh extension tests` (tests about 134 s; the two extension backends about
# 150 s, and flex-causal and the cached step about as many compilations again), then `alibi` in
# a later call; leave `eval rope` to the next task lent one. The machine's image lacks datasets and has a transformers older than the
# project's floor: `bash scripts/gpu_wheels.sh` here puts newer wheels in .whl/, which the call carries (see the
# device README); the project itself runs from the working tree.
set -u -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,temperature.gpu --format=csv
python3 -c "import torch, transformers, cudnn; print(torch.__version__, torch.version.cuda, transformers.__version__,
      'cudnn', torch.backends.cudnn.version(), 'frontend', cudnn.__version__, 'backend', cudnn.backend_version())"
status=0  # a failed stage fails the script, after the later stages have run
ROPE_METHODS=(pi:factor=4 ntk:factor=4 dynamic-ntk:factor=4 ntk-by-parts:factor=4 yarn:factor=4 dynamic-yarn llama3:factor=8)
for stage in "$@"; do
    case "$stage" in
    tests) timeout 200 python3 -m pytest -o addopts="" -m gpu -p no:cacheprovider -q -rs --continue-on-collection-errors ;;
    alibi) timeout 200 python3 scripts/bench_alibi.py --lengths 4096,16384,32768,131072 --out "$OUT/alibi_h100.json" ;;
    eval) timeout 200 python3 scripts/bench_eval.py --output "$OUT/eval_h100.json" ;;
    rope)
        timeout 330 python3 scripts/bench_rope_overhead.py --shape llama-7b --lengths 4096,16384,32768 \
            "${ROPE_METHODS[@]/#/--method=}" --note "H100, device tool" --output "$OUT/rope_overhead_h100.json"
        ;;
    extension)  # both CUDA backends of the remaps in the same rounds, and a cached step; 10 rounds: log-n's margin
        timeout 330 python3 scripts/bench_extension.py --device cuda --dtype bfloat16 --lengths 32k,128k \
            --backend flex,sdpa --decode --repeats 10 --output "$OUT/extension_h100.json" --profile "$OUT/extension_profile"
        ;;
    position-wise)  # a 128k window of the Llama-7B shape, MLPs and norms in slices against one call; 64k for the line
        timeout 330 python3 scripts/bench_position_wise.py --device cuda --shape llama-7b --dtype bfloat16 \
            --length 131072 --repeats 2 --fit-lengths 65536,131072 --output "$OUT/position_wise_h100.json"
        ;;
    *)
        echo "unknown stage $stage: tests, alibi, eval, rope, extension, position-wise" >&2
        exit 2
        ;;
    esac 2>&1 | tee "$OUT/$stage.log" || status=1
done
exit "$status"
