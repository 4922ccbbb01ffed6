"""compare.py on the tiny random Gemma-3: 4 methods x 2 seeds, one iteration each."""
import json
import re

import pytest

import compare

# Flags that make a tiny run fast (as in test_train.py); the truncation penalty gives rewards
# that vary between episodes, so I-PPO keeps some episodes and drops others.
TINY = ("--val-size 4 --truncation-penalty 1 --minibatch-size 4 --micro-batch-size 2 --sft-batch-size 2 "
        "--lr 1e-2")


def test_compare_four_methods_two_seeds(tiny_dir, tmp_path):
    argv = ["--model", tiny_dir, "--data-source", "local", "--seeds", "0,1", "--iterations", "1",
            "--prompts-per-iter", "2", "--samples-per-prompt", "3", "--max-new-tokens", "8",
            "--eval-every", "1", "--eval-limit", "2", "--eval-max-new-tokens", "4", "--final-limit", "2",
            "--no-progress", "--train-args", TINY, "--out", str(tmp_path / "cmp")]
    out = compare.main(argv)
    table = (out / "compare.md").read_text()
    number = r"\d\.\d{3} ± \d\.\d{3}"
    for method in ("SFT", "PPO", "I-PPO", "random filter"):
        row = re.search(rf"^\| {re.escape(method)} \| (.*) \| (.*) \|$", table, re.M)
        assert row, (method, table)
        assert re.fullmatch(number, row.group(1)), row.group(0)
        assert re.fullmatch(number if method != "SFT" else "n/a", row.group(2)), row.group(0)
    assert "| PPO | " in table and re.search(r"^\| PPO \| .* \| 1\.000 ± 0\.000 \|$", table, re.M)  # PPO keeps all
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "results.json").read_text())
    assert sorted((r["method"], r["seed"]) for r in results) == sorted(
        (m, s) for m in ("SFT", "PPO", "I-PPO", "random filter") for s in (0, 1))
    runs = {(r["method"], r["seed"]): r for r in results}
    for seed in (0, 1):
        sft_dir = runs["SFT", seed]["run_dir"]
        for method, influence, random_filter in (("PPO", "off", False), ("I-PPO", "on", False),
                                                 ("random filter", "on", True)):
            config = json.loads(open(f"{runs[method, seed]['run_dir']}/config.json").read())
            assert (config["influence"], config["random_filter"]) == (influence, random_filter)
            assert config["init_adapter"] == sft_dir and config["seed"] == seed and config["val_size"] == 4
    # The random filter drops as many episodes as influence would, in its first iteration.
    kept = {m: runs[m, 0]["kept_fraction"] for m in ("I-PPO", "random filter")}
    assert kept["I-PPO"] == kept["random filter"]
    # Run again: every run directory is resumed, finished runs are not trained again.
    logs = {r["run_dir"]: open(f"{r['run_dir']}/metrics.jsonl").read() for r in results}
    assert compare.main(argv) == out
    assert {d: open(f"{d}/metrics.jsonl").read() for d in logs} == logs
    assert (out / "compare.md").read_text() == table


@pytest.mark.parametrize("flags, says", [(["--seeds", "0,x"], "--seeds"), (["--seeds", "1,1"], "--seeds"),
                                         (["--train-args", "--seed 3"], "--train-args"),
                                         (["--train-args", "--influence=off"], "--train-args"),
                                         (["--metrics", "maj@0"], "--metrics")])
def test_compare_refuses_bad_flags(flags, says, capsys):
    with pytest.raises(SystemExit):
        compare.main(flags)
    assert says in capsys.readouterr().err
