#!/usr/bin/env bash
# Issue 16's GPU runs through the device tool, results and logs under $OUT. Stages, in the order given:
#   bash scripts/gpu_run.sh tests alibi     # python -m pytest -m gpu; scripts/bench_alibi.py
#   bash scripts/gpu_run.sh eval rope extension   # bench_eval.py, bench_rope_overhead.py, bench_extension.py
#   bash scripts/gpu_run.sh extension-sdpa        # bench_extension.py --backend sdpa (the remaps' prefill as tiles)
# (the first five took about 14 minutes on an H100: two calls of the tool's 10-minute limit). A task lent a GPU now
# has 15 minutes of device time, start-up included: one call. Run the stages not measured since the last changes
# first, `bash scripts/gpu_run.sh tests extension-sdpa extension alibi` (timeout_s 590: each stage has its own
# timeout below), and leave `eval rope` to the next task lent one. The machine's
# transformers is older than the project's floor: newer pure-Python wheels travel in .whl/ (see the device
# README); the project itself runs from the working tree.
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
    extension)  # 10 rounds: log-n's margin (0.95x) is within 3 rounds' spread
        timeout 200 python3 scripts/bench_extension.py --device cuda --dtype bfloat16 --lengths 32k,128k \
            --repeats 10 --output "$OUT/extension_h100.json" --profile "$OUT/extension_profile"
        ;;
    extension-sdpa)  # the remaps' sdpa backend on CUDA, a prefill as tiles of flash attention (not measured there yet)
        timeout 200 python3 scripts/bench_extension.py --device cuda --dtype bfloat16 --lengths 32k,128k \
            --backend sdpa --output "$OUT/extension_sdpa_h100.json"
        ;;
    *)
        echo "unknown stage $stage: tests, alibi, eval, rope, extension, extension-sdpa" >&2
        exit 2
        ;;
    esac 2>&1 | tee "$OUT/$stage.log" || status=1
done
exit "$status"
