"""Compare SFT, PPO, I-PPO and the random-filter control over seeds, everything else equal.

The paper's comparison (arXiv 2604.01597): PPO and I-PPO both start from the same SFT
adapters. For each seed s, with the same train.py flags otherwise:

    SFT            train.py --algo sft                      (its adapters start the three below)
    PPO            train.py --influence off --init-adapter SFT_s
    I-PPO          train.py --init-adapter SFT_s             (influence on, reweighted: the default)
    random filter  train.py --random-filter --init-adapter SFT_s   (drops as many episodes as
                                                                    I-PPO would, at random)

Each final checkpoint is evaluated with evaluate.evaluate() (em unless --metrics says more) on
the first --final-limit problems of the test split. Written into --out:
    compare.md    per method: final accuracy and kept fraction, mean +- std over seeds
    compare.png   eval accuracy and kept fraction against iteration, mean over seeds
    results.json  the numbers of every run;  runs/<method>-seed<s>/  the train.py run directories
A run directory that train.py already started (config.json) is resumed (train.py --resume; with
no checkpoint yet it starts over), so an interrupted comparison continues where it stopped.

CLI:
    python compare.py --seeds 0,1 --iterations 20 --out runs/compare [--train-args "--lr 1e-5"]
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

import train
from evaluate import evaluate, load_for_eval, metric_name, parse_metrics
from reward import load_task

METHODS = {"SFT": None, "PPO": ["--influence", "off"], "I-PPO": [], "random filter": ["--random-filter"]}
# train.py flags set through compare.py's own flags (same names, defaults and help as train.py).
PASSTHROUGH = ("model", "dataset", "data_source", "arith_digits", "arith_terms", "prompts_per_iter",
               "samples_per_prompt", "max_new_tokens", "eval_every", "eval_limit", "eval_max_new_tokens",
               "gen_batch_size", "device", "progress")
# Flags compare.py sets per run; --train-args may not override them.
OWNED = ("--algo", "--influence", "--random-filter", "--no-random-filter", "--init-adapter", "--run-dir", "--seed",
         "--resume", "--iterations")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    train.add_config_flags(parser, ("iterations", *PASSTHROUGH))
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds; every method runs once per seed")
    parser.add_argument("--sft-iterations", type=int, default=None, help="SFT batches (None: --iterations)")
    parser.add_argument("--metrics", default="em", help="final evaluation metrics (see evaluate.py)")
    parser.add_argument("--final-limit", type=int, default=0, help="final evaluation on the first K test problems (0 = all)")
    parser.add_argument("--train-args", default="", help="more train.py flags for every run, e.g. \"--lr 1e-5 --kl-beta 0.1\"")
    parser.add_argument("--out", default="runs/compare", help="output directory")
    args = parser.parse_args(argv)
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: expected comma-separated integers, e.g. 0,1")
    if len(set(args.seed_list)) != len(args.seed_list):
        parser.error(f"--seeds {args.seeds!r}: a seed is repeated")
    try:
        args.metric_list = parse_metrics(args.metrics)
    except ValueError as err:
        parser.error(f"--metrics: {err}")
    if args.sft_iterations is None:
        args.sft_iterations = args.iterations
    if args.sft_iterations < 1 or args.final_limit < 0:
        parser.error("--sft-iterations must be >= 1 and --final-limit >= 0")
    args.extra = shlex.split(args.train_args)
    owned = [a for a in args.extra if a.split("=")[0] in OWNED]
    if owned:
        parser.error(f"--train-args: {', '.join(owned)} is set by compare.py for each run")
    return args


def train_argv(args) -> list[str]:
    """The train.py flags every run shares (each run adds --iterations, --seed and its method's flags)."""
    argv = []
    for name in PASSTHROUGH:
        flag, value = "--" + name.replace("_", "-"), getattr(args, name)
        argv += ([flag] if value else ["--no-" + flag[2:]]) if isinstance(value, bool) else [flag, str(value)]
    return argv + args.extra


def run(run_dir: Path, argv: list[str], iterations: int, progress: bool) -> Path:
    """train.main with these flags, or resume the run if train.py already started it there (config.json)."""
    if (run_dir / "config.json").exists():  # started before: resume it (without a checkpoint yet it starts over)
        print(f"[compare] {run_dir}: resuming (a finished run is left as it is)", file=sys.stderr)
        return train.main(["--resume", str(run_dir), "--iterations", str(iterations),
                           "--progress" if progress else "--no-progress"])
    return train.main([*argv, "--run-dir", str(run_dir)])


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def mean_std(values: list[float]) -> str:
    """'mean ± std' over seeds (sample std, denominator S - 1); the mean alone for one seed."""
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def curve(runs: list[dict], key: str) -> tuple[list[int], list[float]]:
    """Mean over seeds of `key` at each iteration that every seed logged."""
    per_seed = [{m["iteration"]: m[key] for m in r["metrics"] if key in m} for r in runs]
    iterations = sorted(set.intersection(*(set(s) for s in per_seed)))
    return iterations, [statistics.mean(s[i] for s in per_seed) for i in iterations]


def write_table(path: Path, results: list[dict], args) -> None:
    names = [metric_name(m) for m in args.metric_list]
    limit = f"first {args.final_limit}" if args.final_limit else "all"
    lines = [f"# SFT, PPO, I-PPO and the random-filter control on {args.dataset}",
             "",
             f"Seeds {args.seeds}; mean ± std over seeds (sample std). Final accuracy: the final checkpoint on "
             f"the {limit} test problems (evaluate.py: {args.metrics}). Kept fraction: the mean over the run's "
             "iterations of kept episodes / all episodes (SFT keeps no episodes).",
             "",
             "| method | " + " | ".join(f"final {n}" for n in names) + " | kept fraction |",
             "|---|" + "---|" * len(names) + "---|"]
    for method in METHODS:
        runs = [r for r in results if r["method"] == method]
        cells = [mean_std([r["final"][n] for r in runs]) for n in names]
        kept = [r["kept_fraction"] for r in runs if r["kept_fraction"] is not None]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {mean_std(kept)} |")
    lines += ["", f"Shared train.py flags: `{' '.join(train_argv(args))}`; PPO methods `--iterations "
              f"{args.iterations}`, SFT `--iterations {args.sft_iterations}`.", ""]
    path.write_text("\n".join(lines))


def write_plot(path: Path, results: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (acc_ax, kept_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for method in METHODS:
        runs = [r for r in results if r["method"] == method]
        x, acc = curve(runs, "eval_accuracy")
        if method == "SFT":  # SFT counts batches, not RL iterations: its last eval is the RL start line
            if acc:
                acc_ax.axhline(acc[-1], color="gray", linestyle="--", label="SFT (final)")
            continue
        acc_ax.plot(x, acc, marker="o", label=method)
        x, kept = curve(runs, "kept_fraction")
        kept_ax.plot(x, kept, marker=".", label=method)
    acc_ax.set(xlabel="iteration", ylabel="eval accuracy (greedy em)", title="eval accuracy, mean over seeds")
    kept_ax.set(xlabel="iteration", ylabel="kept episodes / all", title="kept fraction, mean over seeds", ylim=(0, 1.05))
    acc_ax.set_ylim(bottom=0)
    for ax in (acc_ax, kept_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> Path:
    args = parse_args(argv)
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    shared = train_argv(args)

    test_examples = load_task(args.dataset, "test", args.data_source, arith_digits=args.arith_digits,
                              arith_terms=args.arith_terms).examples   # first: a data error fails fast
    test_examples = test_examples[:args.final_limit] if args.final_limit else test_examples
    results = []
    for seed in args.seed_list:
        sft_dir = run(out / "runs" / f"sft-seed{seed}", ["--algo", "sft", *shared, "--seed", str(seed),
                                                          "--iterations", str(args.sft_iterations)],
                      args.sft_iterations, args.progress)
        results.append({"method": "SFT", "seed": seed, "run_dir": str(sft_dir)})
        for method, flags in METHODS.items():
            if flags is None:
                continue
            slug = method.lower().replace(" ", "-")
            run_dir = run(out / "runs" / f"{slug}-seed{seed}", [*shared, *flags, "--seed", str(seed),
                                                                "--iterations", str(args.iterations),
                                                                "--init-adapter", str(sft_dir)],
                          args.iterations, args.progress)
            results.append({"method": method, "seed": seed, "run_dir": str(run_dir)})

    for r in results:
        print(f"[compare] final evaluation of {r['run_dir']} on {len(test_examples)} problems", file=sys.stderr)
        policy, tokenizer, _, _ = load_for_eval(args.model, r["run_dir"], args.device)
        evaluation = evaluate(policy, tokenizer, test_examples, args.dataset, metrics=args.metric_list,
                              seed=r["seed"], max_new_tokens=args.eval_max_new_tokens,
                              batch_size=args.gen_batch_size, progress=args.progress)
        (Path(r["run_dir"]) / "final_eval.json").write_text(json.dumps(evaluation, indent=2))
        r["final"] = {name: m["value"] for name, m in evaluation["metrics"].items()}
        r["metrics"] = read_metrics(Path(r["run_dir"]))
        kept = [m["kept_fraction"] for m in r["metrics"] if "kept_fraction" in m]
        r["kept_fraction"] = statistics.mean(kept) if kept else None

    write_table(out / "compare.md", results, args)
    write_plot(out / "compare.png", results)
    (out / "results.json").write_text(json.dumps([{k: v for k, v in r.items() if k != "metrics"} for r in results],
                                                 indent=2))
    print((out / "compare.md").read_text())
    print(f"[compare] wrote {out / 'compare.md'}, {out / 'compare.png'}, {out / 'results.json'}")
    return out


if __name__ == "__main__":
    main()
