"""compare.py on the tiny random Gemma-3: methods x seeds x noise levels, one iteration each."""
import json
import re

import pytest

import compare

# Flags that make a tiny run fast (as in test_train.py); the truncation penalty gives rewards
# that vary between episodes, so I-PPO keeps some episodes and drops others.
TINY = ("--val-size 4 --truncation-penalty 1 --minibatch-size 4 --micro-batch-size 2 --sft-batch-size 2 "
        "--lr 1e-2")
FAST = ["--data-source", "local", "--iterations", "1", "--prompts-per-iter", "2", "--samples-per-prompt", "3",
        "--max-new-tokens", "8", "--eval-every", "1", "--eval-limit", "2", "--eval-max-new-tokens", "4",
        "--final-limit", "2", "--no-progress", "--train-args", TINY]
NUMBER = r"-?\d+\.\d+ ± \d+\.\d+"


def row(table, method, section=None):
    if section is not None:
        table = table.split(f"## Reward noise {section}")[1].split("##")[0]
    found = re.search(rf"^\| {re.escape(method)} \| (.*) \|$", table, re.M)
    assert found, (method, table)
    return found.group(1).split(" | ")


def test_compare_sft_start_and_four_methods_two_seeds(tiny_dir, tmp_path):
    argv = ["--model", tiny_dir, "--seeds", "0,1", "--methods", "ppo,grpo,ippo,random-filter", *FAST,
            "--out", str(tmp_path / "cmp")]
    out = compare.main(argv)
    table = (out / "compare.md").read_text()
    for method in ("SFT start", "PPO", "GRPO", "I-PPO", "random filter"):
        em, diff, kept, ess, minutes = row(table, method)
        assert re.fullmatch(NUMBER, em), (method, em)
        assert re.fullmatch(NUMBER, diff) if method != "PPO" else diff == "-", (method, diff)
        assert re.fullmatch(NUMBER if method != "SFT start" else "n/a", kept), (method, kept)
        assert re.fullmatch(r"\d+ ± \d+" if method in ("I-PPO", "random filter") else "n/a", ess), (method, ess)
    assert row(table, "PPO")[2] == "1.00 ± 0.00" and row(table, "GRPO")[2] == "1.00 ± 0.00"   # keep all
    assert (out / "compare-noise0.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "results.json").read_text())
    assert sorted((r["method"], r["seed"]) for r in results) == sorted(
        (m, s) for m in ("SFT start", "ppo", "grpo", "ippo", "random-filter") for s in (0, 1))
    runs = {(r["method"], r["seed"]): r for r in results}
    for seed in (0, 1):
        sft_dir = runs["SFT start", seed]["run_dir"]
        for method, influence, random_filter, advantage in (("ppo", "off", False, "gae"), ("grpo", "off", False, "grpo"),
                                                            ("ippo", "on", False, "gae"),
                                                            ("random-filter", "on", True, "gae")):
            config = json.loads(open(f"{runs[method, seed]['run_dir']}/config.json").read())
            assert (config["influence"], config["random_filter"], config["advantage"]) == (
                influence, random_filter, advantage)
            assert config["init_adapter"] == sft_dir and config["seed"] == seed and config["val_size"] == 4
            assert config["reward_noise"] == 0.0
        # The paired difference is taken per seed: em of the method minus em of PPO, same seed.
    assert f"| I-PPO | 0 | {runs['ippo', 0]['final']['em']:.3f} | {runs['ippo', 1]['final']['em']:.3f} |" in table
    diffs = [100 * (runs["ippo", s]["final"]["em"] - runs["ppo", s]["final"]["em"]) for s in (0, 1)]
    assert row(table, "I-PPO")[1].startswith(f"{sum(diffs) / 2:.1f} ±")
    # The random filter drops as many episodes as influence would, in its first iteration.
    assert runs["ippo", 0]["kept_fraction"] == runs["random-filter", 0]["kept_fraction"]
    # Run again: nothing is trained or evaluated again, the table is the same.
    logs = {r["run_dir"]: open(f"{r['run_dir']}/metrics.jsonl").read() for r in results}
    evals = {r["run_dir"]: open(f"{r['run_dir']}/final_eval.json").read() for r in results}
    assert compare.main(argv) == out
    assert {d: open(f"{d}/metrics.jsonl").read() for d in logs} == logs
    assert {d: open(f"{d}/final_eval.json").read() for d in evals} == evals
    assert (out / "compare.md").read_text() == table


def test_compare_with_noise_in_subprocesses_from_the_model_itself(tiny_dir, tmp_path):
    argv = ["--model", tiny_dir, "--seeds", "0,1", "--methods", "ppo,ippo", "--reward-noise", "0.5",
            "--sft-iterations", "0", "--parallel", "2", *FAST, "--out", str(tmp_path / "cmp")]
    out = compare.main(argv)
    table = (out / "compare.md").read_text()
    results = json.loads((out / "results.json").read_text())
    assert not list((out / "runs").glob("sft-*")) and (out / "start" / "final_eval.json").exists()
    assert sorted((r["method"], r["noise"], r["seed"]) for r in results if r["method"] != "SFT start") == sorted(
        (m, 0.5, s) for m in ("ppo", "ippo") for s in (0, 1))
    for r in results:
        if r["run_dir"]:
            config = json.loads(open(f"{r['run_dir']}/config.json").read())
            assert config["reward_noise"] == r["noise"] and config["init_adapter"] == ""
    # The noisy section has the detection columns, filled for I-PPO, n/a for PPO (no scores);
    # without noise there are none (the first test).
    ippo = row(table, "I-PPO", "0.5")
    assert len(ippo) == 8 and re.fullmatch(NUMBER, ippo[5]) and re.fullmatch(NUMBER, ippo[6])
    assert row(table, "PPO", "0.5")[5:] == ["n/a", "n/a", "n/a"]
    assert (out / "compare-noise0.5.png").exists()


@pytest.mark.parametrize("flags, says", [(["--seeds", "0,x"], "--seeds"), (["--seeds", "1,1"], "--seeds"),
                                         (["--train-args", "--seed 3"], "--train-args"),
                                         (["--train-args", "--influence=off"], "--train-args"),
                                         (["--train-args", "--reward-noise 0.1"], "--train-args"),
                                         (["--methods", "ppo,dpo"], "--methods"),
                                         (["--reward-noise", "0,1.5"], "--reward-noise"),
                                         (["--metrics", "maj@0"], "--metrics")])
def test_compare_refuses_bad_flags(flags, says, capsys):
    with pytest.raises(SystemExit):
        compare.main(flags)
    assert says in capsys.readouterr().err


def test_paired_tables_by_hand():
    """I-PPO minus PPO per seed and noise level, and what the noise costs each method."""
    em = {("ppo", 0.0): [0.40, 0.50, 0.45], ("ippo", 0.0): [0.42, 0.50, 0.50],
          ("ppo", 0.2): [0.30, 0.40, 0.35], ("ippo", 0.2): [0.40, 0.44, 0.46]}
    results = [{"method": m, "noise": p, "seed": s, "final": {"em": v}} for (m, p), vs in em.items()
               for s, v in enumerate(vs)]
    args = compare.parse_args(["--methods", "ppo,ippo", "--seeds", "0,1,2", "--reward-noise", "0,0.2"])
    lines = compare.paired_tables(results, args)
    # noise 0: I-PPO - PPO = 2, 0, 5 points: mean 2.333, sd 2.517, t(2) = 4.303 -> half-width 6.25
    # noise 0.2: 10, 4, 11: mean 8.333, sd 3.786 -> 9.41
    assert "| I-PPO vs PPO | 2.3 ± 6.3 | 8.3 ± 9.4 |" in lines
    # the noise costs PPO 10, 10, 10 points (no spread) and I-PPO 2, 6, 4
    assert "| PPO | -10.0 ± 0.0 |" in lines and "| I-PPO | -4.0 ± 5.0 |" in lines


# ----------------------------------------------------------------------------- faithful accuracy (arith)

def write_run(run_dir, rows, final_eval):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "final_eval.json").write_text(json.dumps(final_eval))
    return run_dir / "final_eval.json"


def test_summarize_run_reads_faithful_accuracy_from_new_and_old_records(tmp_path):
    """The eval curve and the final value, whether train.py / evaluate.py logged the faithful
    accuracy (new) or only the accuracy and the unfaithful share it is made of (old); none off arith."""
    rows = [{"iteration": 0, "eval_accuracy": 0.30, "eval_unfaithful_of_correct": 0.5},   # old: 0.3 x 0.5
            {"iteration": 1, "accuracy": 0.2, "faithful_fraction": 0.1, "kept_fraction": 1.0},  # no eval
            {"iteration": 2, "eval_accuracy": 0.0, "eval_unfaithful_of_correct": None},   # old, nothing correct
            {"iteration": 3, "eval_accuracy": 0.50, "eval_unfaithful_of_correct": 0.2, "eval_faithful_accuracy": 0.4}]
    greedy = {"faithful": 3, "unfaithful": 1, "wrong": 4, "unfaithful_of_correct": 0.25, "n_correct": 4}
    new = {"metrics": {"em": {"value": 0.5}}, "reasoning": {"greedy": greedy | {"faithful_accuracy": 0.375}}}
    old = {"metrics": {"em": {"value": 0.5}}, "reasoning": {"greedy": greedy}}
    for name, final_eval in (("new", new), ("old", old)):
        path = write_run(tmp_path / name, rows, final_eval)
        run = compare.summarize_run({"method": "ppo", "seed": 0, "noise": 0.0, "run_dir": tmp_path / name}, [path])
        assert run["faithful_curve"] == pytest.approx({0: 0.15, 2: 0.0, 3: 0.4})
        assert run["final"] == pytest.approx({"em": 0.5, "faithful": 3 / 8})
    # gsm8k: no labels anywhere, no faithful accuracy
    path = write_run(tmp_path / "gsm8k", [{"iteration": 0, "eval_accuracy": 0.3}], {"metrics": {"em": {"value": 0.3}}})
    run = compare.summarize_run({"method": "ppo", "seed": 0, "noise": 0.0, "run_dir": tmp_path / "gsm8k"}, [path])
    assert run["faithful_curve"] == {} and run["final"] == {"em": 0.3}


# PPO ahead in em by 4 points, behind I-PPO in faithful accuracy by 8, 10 and 12 points.
FINALS = {"ppo": ([0.50, 0.54, 0.52], [0.20, 0.22, 0.24]), "ippo": ([0.46, 0.50, 0.48], [0.28, 0.32, 0.36])}


def hand_made_results(with_faithful):
    results = []
    for method, (em, faithful) in FINALS.items():
        for seed in range(3):
            curve = {0: 0.1, 10: faithful[seed]} if with_faithful else {}
            results.append({"method": method, "noise": 0.0, "seed": seed, "run_dir": f"runs/{method}-{seed}",
                            "final": {"em": em[seed]} | ({"faithful": faithful[seed]} if with_faithful else {}),
                            "kept_fraction": 1.0, "weight_ess": {}, "train_minutes": 1.0,
                            "curve": [(0, 0.0, 0.2), (10, 1.0, em[seed])], "faithful_curve": curve, "kept": {1: 1.0},
                            "seconds": {1: 1.0}, "flip_auc": {}, "flipped_share_dropped": {}, "flipped_share_kept": {}})
    return results


def test_table_has_faithful_accuracy_beside_em_on_arith(tmp_path):
    args = compare.parse_args(["--dataset", "arith", "--methods", "ppo,ippo", "--seeds", "0,1,2"])
    compare.write_table(tmp_path / "compare.md", hand_made_results(True), args)
    table = (tmp_path / "compare.md").read_text()
    assert "| method | final em | final faithful acc | em - PPO (pt) | faithful acc - PPO (pt) | kept |" in table
    # I-PPO: faithful 0.28, 0.32, 0.36: mean 0.32, sd 0.04, t(2) = 4.303 -> half-width 0.099;
    # minus PPO 8, 10, 12 points: mean 10, sd 2 -> 4.97; em minus PPO -4 every seed.
    assert row(table, "I-PPO")[:4] == ["0.480 ± 0.050", "0.320 ± 0.099", "-4.0 ± 0.0", "10.0 ± 5.0"]
    assert row(table, "PPO")[1:4] == ["0.220 ± 0.050", "-", "-"]
    faithful_sections = table.split("## Paired differences in final faithful acc")[1]
    assert "| I-PPO vs PPO | 10.0 ± 5.0 |" in faithful_sections.split("##")[0]
    assert "| I-PPO | 0 | 0.280 | 0.320 | 0.360 |" in table.split("## Final faithful acc of every run")[1]
    assert "| I-PPO | 0 | 0.460 | 0.500 | 0.480 |" in table.split("## Final em of every run")[1]


def test_table_has_no_faithful_accuracy_off_arith(tmp_path):
    args = compare.parse_args(["--dataset", "gsm8k", "--methods", "ppo,ippo", "--seeds", "0,1,2"])
    compare.write_table(tmp_path / "compare.md", hand_made_results(False), args)
    table = (tmp_path / "compare.md").read_text()
    assert "faithful" not in table
    assert "| method | final em | em - PPO (pt) | kept | ess | training min |" in table
    assert row(table, "I-PPO")[:2] == ["0.480 ± 0.050", "-4.0 ± 0.0"]


def test_plot_draws_the_mean_faithful_accuracy_over_seeds(tmp_path):
    from matplotlib.figure import Figure
    ax = Figure().subplots()
    runs = [r for r in hand_made_results(True) if r["method"] == "ippo"]
    compare.draw_faithful(ax, runs, "C1", "I-PPO")
    mean = [line for line in ax.lines if line.get_label() == "I-PPO (mean)"]
    assert len(mean) == 1 and len(ax.lines) == 4                     # three faint seeds and the mean
    assert list(mean[0].get_xdata()) == [0, 10] and list(mean[0].get_ydata()) == pytest.approx([0.1, 0.32])
    compare.write_plot(tmp_path / "arith.png", hand_made_results(True), 0.0, ["ppo", "ippo"])
    compare.write_plot(tmp_path / "gsm8k.png", hand_made_results(False), 0.0, ["ppo", "ippo"])
    for name in ("arith.png", "gsm8k.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
