#!/bin/bash
# Every GPU figure the README lacks, from one command, into one file (runs in under 8 minutes on
# one H200; --smoke runs the same steps on the CPU with the tiny model in under a minute, which CI does).
#
#   bash bench/gpu_check.sh                 # on a GPU machine: writes runs/gpu-check/gpu_check.md
#   bash bench/gpu_check.sh --smoke         # anywhere: the same steps, tiny model, CPU
#   OUT=somewhere bash bench/gpu_check.sh
#
# What it measures (on the offline Gemma-3-270M; --smoke: the tiny random Gemma-3):
#   1. influence scoring at N = 8, 16, 32, 64 episodes in bf16 and fp32: loop vs one-pass seconds,
#      one-pass vs one batched forward+backward, and how far one-pass scores are from the loop's
#      (bench/influence_bench.py);
#   2. peak GPU memory of one PPO update step at 16 x 256 response tokens, plain and lean log-probs;
#   3. seconds per phase of two I-PPO iterations at the default batch (16 prompts x 4 samples,
#      256 new tokens, GSM8K), from the run's metrics.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
SMOKE=0
[ "${1:-}" = "--smoke" ] && SMOKE=1
if [ $SMOKE = 1 ]; then
    OUT=${OUT:-runs/gpu-check-smoke}; DEVICE=cpu; MODEL=tiny; SIZES=4; REPEATS=1; MEMORY=4,32
    TRAIN_MODEL=$(python -c "import tiny_world, pathlib, tempfile; print(tiny_world.make_random_model_dir(pathlib.Path(tempfile.mkdtemp())))")
    BATCH="--prompts-per-iter 2 --samples-per-prompt 2 --max-new-tokens 16 --val-size 4 --data-source local"
else
    OUT=${OUT:-runs/gpu-check}; DEVICE=cuda; MODEL=gemma-3-270m; SIZES=8,16,32,64; REPEATS=5; MEMORY=16,256
    TRAIN_MODEL=gemma-3-270m
    BATCH="--prompts-per-iter 16 --samples-per-prompt 4 --max-new-tokens 256 --data-source local"
    python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU here: run with --smoke on a CPU')"
fi
rm -rf "$OUT"
mkdir -p "$OUT"
REPORT="$OUT/gpu_check.md"
t0=$SECONDS

{
    echo "# GPU check ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$([ $SMOKE = 1 ] && echo ', SMOKE: tiny model on the CPU'))"
    echo
    echo '```'
    python -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__, '| cuda', torch.version.cuda, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    echo '```'
    echo
    echo "## 1-2. Influence scoring (loop vs one-pass vs one forward+backward) and PPO-step memory"
    echo
    echo "bench/influence_bench.py --models $MODEL --memory-models $MODEL --memory-shape $MEMORY --device $DEVICE --dtypes bf16,fp32 --sizes $SIZES --repeats $REPEATS"
    echo '```'
} > "$REPORT"
python bench/influence_bench.py --models "$MODEL" --memory-models "$MODEL" --memory-shape "$MEMORY" --device "$DEVICE" --dtypes bf16,fp32 \
    --sizes "$SIZES" --repeats "$REPEATS" | tee -a "$REPORT"
echo '```' >> "$REPORT"

# 3. Two I-PPO iterations at the default batch; the per-phase seconds come from metrics.jsonl.
python train.py --model "$TRAIN_MODEL" --dataset gsm8k $BATCH --iterations 2 --eval-every 0 --device "$DEVICE" \
    --no-progress --no-plots --run-dir "$OUT/ippo" > "$OUT/ippo.log" 2>&1 || { tail -20 "$OUT/ippo.log"; exit 1; }
python - "$OUT/ippo" "$BATCH" "$DEVICE" >> "$REPORT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if '"seconds"' in l]
order = ["rollout", "reward", "advantages", "influence", "update"]
phases = sorted({k for r in rows for k in r["seconds"]}, key=lambda p: (order + [p]).index(p))
dtype = "bf16" if sys.argv[3] == "cuda" else "fp32"
print(f"\n## 3. Seconds per phase, two I-PPO iterations ({sys.argv[2]}; --dtype auto: {dtype})\n")
print("| iteration | " + " | ".join(phases) + " | total | kept |")
print("|---" * (len(phases) + 3) + "|")
for r in rows:
    s = r["seconds"]
    print(f"| {r['iteration']} | " + " | ".join(f"{s.get(p, 0):.1f}" for p in phases) + f" | {sum(s.values()):.1f} | {r['kept']}/{r['episodes']} |")
PY
echo -e "\nWall time of the whole check: $(( SECONDS - t0 )) s" >> "$REPORT"
cat "$REPORT"
