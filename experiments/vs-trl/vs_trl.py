"""Seconds per step: our GRPO, PPO and I-PPO against TRL's GRPOTrainer on the same work.

    pip install trl==1.16.0                     # benchmark only; not in requirements.txt
    HF_HUB_OFFLINE=1 python experiments/vs-trl/vs_trl.py              # tiny-arith, then Gemma-3-270M
    HF_HUB_OFFLINE=1 python experiments/vs-trl/vs_trl.py --models tiny-arith --runs 1 --steps 3   # a quick check
    HF_HUB_OFFLINE=1 python experiments/vs-trl/vs_trl.py --models gemma-3-270m --prompts 4 --samples 4 --new-tokens 24
                                                 # the 270M at a size 2 cores run in minutes a step
    python experiments/vs-trl/vs_trl.py --report experiments/vs-trl/vs-trl-tiny.json   # a record's table again

The same work on both sides: one model (tiny-arith, the tiny world's 1M-parameter Gemma-3, or
the offline Gemma-3-270M), arith prompts in our prompt format, --prompts x --samples episodes
a step (8 x 8 = 64 by default), at most --new-tokens new tokens (40) at temperature 1, LoRA r = 8
(alpha 16) on q, k, v, o, KL beta 0, one epoch of one minibatch of every episode (one optimizer
step per batch of episodes), constant learning rate 1e-3, fp32, eager attention, no gradient
checkpointing, one forward and backward for the whole minibatch (our --micro-batch-size, TRL's
per-device batch: all episodes). I-PPO also computes g_val on train.py's default 32 validation
reference solutions, in one forward and backward (--val-batch-size 32).
TRL: GRPOTrainer with PEFT's LoRA, timed from on_step_begin to on_step_end (generation,
scoring and the update); ours: train.py, the sum of the per-phase seconds of each iteration
in metrics.jsonl (rollout, reward, advantages, influence, update; the checkpoint written after
each iteration is not counted, as TRL here saves nothing). Reported: the median over steps 2 to
--steps of each run, the median over --runs runs, seconds per 1000 generated tokens, and each
of ours divided by TRL's.

It runs each configuration alone, one after the other, each run in a fresh Python process (the
first run in a process was measured slower than later ones): run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

import tasks  # noqa: E402
import reward  # noqa: E402
import train  # noqa: E402
from offline_models import model_source  # noqa: E402

LR = 1e-3
OURS = {"GRPO": ["--advantage", "grpo", "--influence", "off"],
        "PPO": ["--influence", "off"],
        "I-PPO": ["--influence", "on", "--val-batch-size", "32"]}


@dataclass
class Work:
    """The size of a step, the same on both sides."""
    prompts: int = 8
    samples: int = 8
    new_tokens: int = 40


def run_ours(model: str, flags: list[str], steps: int, out: Path, work: Work) -> list[dict]:
    """train.py with the shared settings; per step: seconds (sum of phases) and generated tokens."""
    episodes = str(work.prompts * work.samples)
    run_dir = train.main(["--model", model, "--dataset", "arith", "--iterations", str(steps),
                          "--prompts-per-iter", str(work.prompts), "--samples-per-prompt", str(work.samples),
                          "--max-new-tokens", str(work.new_tokens), "--temperature", "1.0", "--lr", str(LR),
                          "--kl-beta", "0", "--ppo-epochs", "1", "--minibatch-size", episodes,
                          "--micro-batch-size", episodes, "--gen-batch-size", episodes,
                          "--eval-every", "0", "--no-progress", "--no-plots", "--run-dir", str(out), *flags])
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{"seconds": sum(r["seconds"].values()), "tokens": r["response_tokens"] * r["episodes"]} for r in rows]


def run_trl(model: str, steps: int, out: Path, work: Work) -> list[dict]:
    """TRL's GRPOTrainer on the same prompts, reward, batch and settings."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    source = str(model_source(model))
    task = tasks.load_task("arith", "train", "local")
    examples = task.examples[:work.prompts * (steps + 1)]
    dataset = Dataset.from_list([{"prompt": tasks.make_prompt(e.question, "arith"), "gold": e.gold} for e in examples])

    def correct(completions, gold, **_):
        return [reward.reward_fn(c, g, "arith") for c, g in zip(completions, gold)]

    class Timer(TrainerCallback):
        def __init__(self):
            self.steps, self.t0 = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.steps.append({"seconds": time.perf_counter() - self.t0})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs and self.steps:
                self.steps[-1]["tokens"] = float(logs["completions/mean_length"]) * work.prompts * work.samples

    tokenizer = AutoTokenizer.from_pretrained(source)
    lm = AutoModelForCausalLM.from_pretrained(source, dtype="float32", attn_implementation="eager")
    config = GRPOConfig(output_dir=str(out), per_device_train_batch_size=work.prompts * work.samples,
                        num_generations=work.samples,
                        max_completion_length=work.new_tokens, temperature=1.0, top_k=0, top_p=1.0, beta=0.0,
                        num_iterations=1, gradient_accumulation_steps=1, learning_rate=LR, lr_scheduler_type="constant",
                        warmup_steps=0, max_steps=steps, bf16=False, fp16=False, gradient_checkpointing=False,
                        use_cpu=True, logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True, seed=0)
    timer = Timer()
    trainer = GRPOTrainer(model=lm, reward_funcs=correct, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer],
                          peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    trainer.train()
    return timer.steps


def median_step(steps: list[dict]) -> dict:
    later = steps[1:] or steps                       # step 1 warms up (allocations, first compile of kernels)
    return {"seconds": statistics.median(s["seconds"] for s in later),
            "ms_per_1k_tokens": statistics.median(1e6 * s["seconds"] / max(s.get("tokens", 0), 1) for s in later)}


def fresh_process_run(model: str, name: str, args) -> dict:
    """One run of one configuration in a new Python process (`--single`), so that no run inherits
    the heap of another (measured on the 270M, all in one process: TRL took 21.2 s a step as the
    first configuration and 16.0 s as the last; our PPO 12.6 s as the third, 16.4 s as the first)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "median.json"
        subprocess.run([sys.executable, __file__, "--single", model, name, "--steps", str(args.steps),
                        "--prompts", str(args.prompts), "--samples", str(args.samples),
                        "--new-tokens", str(args.new_tokens), "--out", str(out)], check=True)
        return json.loads(out.read_text())


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny-arith,gemma-3-270m")
    parser.add_argument("--steps", type=int, default=12, help="steps per run (the median is over steps 2..steps)")
    parser.add_argument("--runs", type=int, default=3, help="runs per configuration on tiny-arith")
    parser.add_argument("--runs-270m", type=int, default=1, help="runs per configuration on Gemma-3-270M")
    parser.add_argument("--prompts", type=int, default=Work.prompts, help="prompts per step")
    parser.add_argument("--samples", type=int, default=Work.samples, help="samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=Work.new_tokens, help="most new tokens per sample")
    parser.add_argument("--trainers", default="TRL GRPOTrainer,GRPO,PPO,I-PPO",
                        help="which to run, in this order (comma-separated); a ratio to one not run is nan")
    parser.add_argument("--out", default=None, help="also write the rows as JSON here")
    parser.add_argument("--report", nargs="+", metavar="RECORD", help="run nothing: the table of records written "
                        "with --out before")
    parser.add_argument("--single", nargs=2, metavar=("MODEL", "TRAINER"),
                        help="(internal) one run of one configuration in this process; --out gets its medians")
    args = parser.parse_args(argv)
    if args.report:
        rows = [row for path in args.report for row in json.loads(Path(path).read_text())]
        print(table(rows))
        return rows
    work = Work(args.prompts, args.samples, args.new_tokens)
    if args.single:
        model, name = args.single
        with tempfile.TemporaryDirectory() as tmp:
            steps = (run_trl(model, args.steps, Path(tmp), work) if name.startswith("TRL")
                     else run_ours(model, OURS[name], args.steps, Path(tmp) / "run", work))
        Path(args.out).write_text(json.dumps(median_step(steps)))
        return []
    import torch
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads; {work.prompts} x {work.samples} episodes, "
          f"{work.new_tokens} new tokens, LoRA r=8 on q,k,v,o, beta 0, one minibatch, fp32", flush=True)
    rows = []
    for model in args.models.split(","):
        runs = args.runs if model.startswith("tiny-arith") else args.runs_270m
        results = {}
        for name in args.trainers.split(","):
            per_run = []
            for r in range(runs):
                per_run.append(fresh_process_run(model, name, args))
                print(f"[{model}] {name} run {r + 1}: {per_run[-1]['seconds']:.3f} s per step", flush=True)
            results[name] = {k: statistics.median(p[k] for p in per_run) for k in per_run[0]}
            results[name]["per_run_seconds"] = [p["seconds"] for p in per_run]   # for intervals over runs
        trl = results.get("TRL GRPOTrainer", {}).get("seconds", float("nan"))      # nan: not run
        for name, res in results.items():
            rows.append({"model": model, "trainer": name, **res, "vs_trl": res["seconds"] / trl, "runs": runs,
                         "steps": args.steps, **asdict(work)})
    print("\n" + table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return rows


def table(rows: list[dict]) -> str:
    """Seconds per step of each row, per 1000 generated tokens, and over TRL's and our PPO's of
    the same record (nan: not in it)."""
    lines = ["| model | trainer | s per step | ms per 1000 generated tokens | / TRL | / our PPO |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ppo = next((p["seconds"] for p in rows if p["model"] == r["model"] and p["trainer"] == "PPO"), float("nan"))
        lines.append(f"| {r['model']} | {r['trainer']} | {r['seconds']:.3f} | {r['ms_per_1k_tokens']:.0f} | "
                     f"{r['vs_trl']:.2f} | {r['seconds'] / ppo:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
