#!/bin/bash
# The laptop experiment (README.md beside this file): the offline Gemma-3-270M on
# --dataset arith, on a 2-core CPU. One SFT run (150 batches of 8 reference solutions), then
# from its adapters PPO, I-PPO and the random-filter control for each seed, the three of a seed
# running at the same time with one thread each. No KL penalty (--kl-beta 0) in these short runs. Writes runs/arith-laptop/{compare.md,compare.png}.
#   bash experiments/arith-laptop/arith_laptop.sh            # seeds 0 and 1
#   SEEDS="0" ITERS=5 bash experiments/arith-laptop/arith_laptop.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/arith-laptop}
SEEDS=${SEEDS:-"0 1"}
ITERS=${ITERS:-10}
export HF_HUB_OFFLINE=1
mkdir -p "$OUT"
COMMON="--dataset arith --val-size 16 --eval-limit 50 --eval-max-new-tokens 32 --no-progress --no-plots"

[ -e "$OUT/sft/checkpoints/latest" ] || python train.py $COMMON --algo sft --iterations 150 --sft-batch-size 8 \
    --lr 5e-4 --eval-every 50 --run-dir "$OUT/sft" > "$OUT/sft.log" 2>&1

declare -A FLAGS=([ppo]="--influence off" [ippo]="--influence on" [random]="--influence on --random-filter")
for seed in $SEEDS; do
    t0=$SECONDS
    for method in ppo ippo random; do
        grep -qs "^\[done\]" "$OUT/$method-s$seed.log" && continue   # finished before: keep it
        OMP_NUM_THREADS=1 python train.py $COMMON ${FLAGS[$method]} --seed "$seed" --init-adapter "$OUT/sft" \
            --iterations "$ITERS" --prompts-per-iter 4 --samples-per-prompt 4 --max-new-tokens 32 \
            --lr 2e-4 --kl-beta 0 --truncation-penalty 0.5 --minibatch-size 8 --eval-every 5 \
            --run-dir "$OUT/$method-s$seed" > "$OUT/$method-s$seed.log" 2>&1 &
    done
    wait
    echo "seed $seed: the three runs took $(( SECONDS - t0 )) s wall" | tee -a "$OUT/wall.txt"
done

python - "$OUT" $SEEDS <<'PY'
import sys, statistics
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from compare import read_metrics
out, seeds = Path(sys.argv[1]), sys.argv[2:]
names = {"ppo": "PPO", "ippo": "I-PPO", "random": "random filter"}
results = [{"method": "SFT", "seed": 0, "metrics": read_metrics(out / "sft")}]
results += [{"method": names[m], "seed": s, "metrics": read_metrics(out / f"{m}-s{s}")} for m in names for s in seeds]
fig, (acc_ax, kept_ax) = plt.subplots(1, 2, figsize=(11, 4))
for i, name in enumerate(names.values()):        # one line per seed, a colour per method
    for r in (r for r in results if r["method"] == name):
        acc = [(m["iteration"], m["eval_accuracy"]) for m in r["metrics"] if "eval_accuracy" in m]
        kept = [(m["iteration"], m["kept_fraction"]) for m in r["metrics"] if "kept_fraction" in m]
        acc_ax.plot(*zip(*acc), color=f"C{i}", marker="o", label=f"{name} seed {r['seed']}")
        kept_ax.plot(*zip(*kept), color=f"C{i}", marker=".", label=f"{name} seed {r['seed']}")
acc_ax.set(xlabel="RL iteration", ylabel="eval accuracy (greedy em)")
kept_ax.set(xlabel="RL iteration", ylabel="kept episodes / all", ylim=(0, 1.05))
for ax in (acc_ax, kept_ax):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(out / "compare.png", dpi=120)
lines = ["| method | seed | eval acc at RL start | final eval acc | mean kept fraction | timed phases, min |", "|---|---|---|---|---|---|"]
for r in results[1:]:
    evals = [(m["iteration"], m["eval_accuracy"]) for m in r["metrics"] if "eval_accuracy" in m]
    kept = [m["kept_fraction"] for m in r["metrics"] if "kept_fraction" in m]
    wall = sum(sum(m.get("seconds", {}).values()) for m in r["metrics"]) / 60
    lines.append(f"| {r['method']} | {r['seed']} | {evals[0][1]:.2f} | {evals[-1][1]:.2f} (it {evals[-1][0]}) | "
                 f"{statistics.mean(kept):.2f} | {wall:.1f} |")
sft = [(m["iteration"], m["eval_accuracy"]) for m in results[0]["metrics"] if "eval_accuracy" in m]
lines.append("")
lines.append("SFT eval accuracy by batch: " + ", ".join(f"{i}: {a:.2f}" for i, a in sft))
(out / "compare.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
