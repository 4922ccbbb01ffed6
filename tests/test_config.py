"""Nonsense flags are refused at start with a message naming the flag and no traceback; the
flags that only the model's config or the data can judge are refused before the model loads."""
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from config import parse_config

ROOT = Path(__file__).resolve().parent.parent

# (flags, the flag the message must name): judged from the flags alone.
REFUSED_BY_VALIDATE = [
    (["--prompts-per-iter", "-1"], "--prompts-per-iter"),
    (["--samples-per-prompt", "0"], "--samples-per-prompt"),
    (["--gen-batch-size", "-4"], "--gen-batch-size"),
    (["--minibatch-size", "0"], "--minibatch-size"),
    (["--micro-batch-size", "-1"], "--micro-batch-size"),
    (["--sft-batch-size", "0"], "--sft-batch-size"),
    (["--val-batch-size", "0"], "--val-batch-size"),
    (["--iterations", "0"], "--iterations"),
    (["--ppo-epochs", "0"], "--ppo-epochs"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints"),
    (["--clip-eps", "0"], "--clip-eps"),
    (["--clip-eps", "-0.1"], "--clip-eps"),
    (["--clip-eps", "nan"], "--clip-eps"),
    (["--clip-eps", "inf"], "--clip-eps"),
    (["--value-clip-eps", "-0.1"], "--value-clip-eps"),
    (["--value-lr", "0"], "--value-lr"),
    (["--adv-std-floor", "-1"], "--adv-std-floor"),
    (["--lr", "0"], "--lr"),
    (["--lr", "inf"], "--lr"),
    (["--temperature", "0"], "--temperature"),
    (["--max-grad-norm", "-1"], "--max-grad-norm"),
    (["--lora-rank", "0"], "--lora-rank"),
    (["--lora-alpha", "0"], "--lora-alpha"),
    (["--lora-targets", ""], "--lora-targets"),
    (["--lora-targets", "q_proj,,v_proj"], "--lora-targets"),
    (["--lora-targets", "q_proj;v_proj"], "--lora-targets"),
    (["--lora-targets", "q_proj,q_proj"], "--lora-targets"),
    (["--gamma", "1.5"], "--gamma"),
    (["--lam", "-0.1"], "--lam"),
    (["--kl-beta", "-1"], "--kl-beta"),
    (["--vf-coef", "-1"], "--vf-coef"),
    (["--ent-coef", "nan"], "--ent-coef"),
    (["--truncation-penalty", "-1"], "--truncation-penalty"),
    (["--eval-every", "-1"], "--eval-every"),
    (["--stop-below-kept", "1"], "--stop-below-kept"),
    (["--influence", "off", "--random-filter"], "--random-filter"),
    (["--influence", "off", "--no-reweight"], "--reweight"),
    (["--device", "tpu"], "--device"),
    (["--resume", "/no/such/run"], "--resume"),
]


@pytest.mark.parametrize("flags, flag", REFUSED_BY_VALIDATE, ids=[" ".join(f) for f, _ in REFUSED_BY_VALIDATE])
def test_nonsense_flags_are_refused_naming_the_flag(flags, flag):
    with pytest.raises(SystemExit) as refused:
        parse_config(flags)
    assert isinstance(refused.value.code, str) and refused.value.code.startswith(flag), refused.value.code


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible")
def test_a_device_that_is_not_there_is_refused():
    with pytest.raises(SystemExit, match="--device: no CUDA GPU is visible"):
        parse_config(["--device", "cuda"])


def test_values_of_the_wrong_type_are_refused_by_argparse_naming_the_flag(capsys):
    for flags, flag in [(["--iterations", "abc"], "--iterations"), (["--dataset", "chess"], "--dataset"),
                        (["--lr", "fast"], "--lr")]:
        with pytest.raises(SystemExit) as refused:
            parse_config(flags)
        assert refused.value.code == 2 and f"argument {flag}" in capsys.readouterr().err


def test_sensible_flags_pass_and_lora_targets_may_have_spaces():
    cfg = parse_config(["--lora-targets", "q_proj, v_proj", "--clip-eps", "0.1", "--gamma", "1"])
    assert cfg.targets() == ["q_proj", "v_proj"] and math.isclose(cfg.clip_eps, 0.1)


@pytest.fixture
def model_never_loads(monkeypatch):
    """These flags must be refused before the (slow) model load."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the flags were checked")
    monkeypatch.setattr(train, "load_policy", refuse)


def refusal(tiny_dir, run_dir, *flags) -> str:
    with pytest.raises(SystemExit) as refused:
        train.main(["--model", tiny_dir, "--run-dir", str(run_dir), "--data-source", "local", "--no-progress", *flags])
    assert isinstance(refused.value.code, str)
    return refused.value.code


def test_an_unknown_model_is_refused_naming_the_flag(tiny_dir, tmp_path, model_never_loads):
    for model in ["/no/such/model/dir", str(tmp_path), "no-such-org/no-such-model"]:
        with pytest.raises(SystemExit, match=r"--model .*could not load it"):
            train.main(["--model", model, "--run-dir", str(tmp_path / "r"), "--data-source", "local"])


@pytest.mark.parametrize("flags, message", [
    (["--lora-targets", "q_proj,bogus_proj"], r"--lora-targets: .* no linear layer named \['bogus_proj'\]"),
    (["--max-new-tokens", "5000"], r"--max-new-tokens 5000: longer than the model's context \(1024 tokens"),
    (["--max-new-tokens", "1024"], r"--max-new-tokens 1024: longer than the model's context"),
    (["--eval-max-new-tokens", "2000"], r"--eval-max-new-tokens 2000: longer than the model's context"),
    (["--val-size", "7473"], r"--val-size 7473: the training split has only 7473 rows"),
    (["--init-adapter", "/no/such/checkpoint"], r"--init-adapter /no/such/checkpoint: neither a checkpoint"),
])
def test_flags_that_do_not_fit_the_model_or_data_are_refused_before_loading(tiny_dir, tmp_path, model_never_loads,
                                                                          flags, message):
    import re
    assert re.search(message, refusal(tiny_dir, tmp_path / "r", *flags))
    assert not (tmp_path / "r").exists()   # refused before the run directory was made


def test_a_run_directory_is_never_overwritten(tiny_dir, tmp_path, model_never_loads):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"iteration": 0}\n')
    assert "already holds a run; use --resume" in refusal(tiny_dir, run_dir)
    assert (run_dir / "metrics.jsonl").read_text() == '{"iteration": 0}\n'
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert "exists and is not a directory" in refusal(tiny_dir, a_file)


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ('{"lr": 1e-4, "rocket_boost": true}', r"unknown fields \['rocket_boost'\]"),
    ('{"lr": "fast"}', "field 'lr' should be float"),
    ('{"iterations": 2.5}', "field 'iterations' should be int"),
    ('{"clip_eps": -1}', "--clip-eps: must be > 0"),
])
def test_a_tampered_config_json_is_refused_on_resume(tmp_path, content, message):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(content)
    with pytest.raises(SystemExit, match=message):
        parse_config(["--resume", str(run_dir)])


def test_the_command_line_refuses_without_a_traceback(tiny_dir):
    for flags, flag in [(["--clip-eps", "0"], "--clip-eps"), (["--model", "/no/such/dir"], "--model")]:
        done = subprocess.run([sys.executable, "train.py", *flags, "--data-source", "local"], cwd=ROOT,
                              capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith(flag), done.stderr


def test_config_json_round_trips_through_resume(tiny_dir, tmp_path):
    cfg = parse_config(["--run-dir", str(tmp_path / "r"), "--lr", "3e-5", "--lora-targets", "q_proj,v_proj"])
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    resumed = parse_config(["--resume", str(tmp_path / "r")])
    assert resumed.lr == 3e-5 and resumed.lora_targets == "q_proj,v_proj" and resumed.resume == str(tmp_path / "r")


def test_resume_takes_iterations_even_at_the_default_value_and_names_what_it_ignores(tiny_dir, tmp_path, capsys):
    from config import Config
    cfg = parse_config(["--model", tiny_dir, "--run-dir", str(tmp_path / "r"), "--iterations", "7", "--no-progress"])
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    default_iterations = Config().iterations
    resumed = parse_config(["--resume", str(tmp_path / "r"), "--iterations", str(default_iterations)])
    assert resumed.iterations == default_iterations         # given, so taken, though equal to the default
    assert resumed.progress is False                        # not given: the run's own
    assert "ignoring" not in capsys.readouterr().err
    resumed = parse_config(["--resume", str(tmp_path / "r"), "--lr", str(Config().lr), "--seed", "3"])
    assert resumed.iterations == 7 and resumed.seed == cfg.seed
    err = capsys.readouterr().err
    assert "ignoring --lr, --seed" in err                   # named even when given at its default value


@pytest.mark.parametrize("argv,named", [
    (["--advantage", "grpo", "--vf-coef", "0.5"], ("--vf-coef", "--advantage grpo")),
    (["--advantage", "grpo", "--gamma", "1.0"], ("--gamma", "--advantage grpo")),
    (["--advantage", "grpo", "--lam", "1.0"], ("--lam", "--advantage grpo")),
    (["--advantage", "grpo", "--adv-std-floor", "0.1"], ("--adv-std-floor", "--advantage grpo")),
    (["--advantage", "grpo", "--value-clip-eps", "0.2"], ("--value-clip-eps", "--advantage grpo")),
    (["--advantage", "grpo", "--value-lr", "1e-3"], ("--value-lr", "--advantage grpo")),
    (["--influence", "off", "--stop-below-kept", "0.1"], ("--stop-below-kept", "--influence off")),
    (["--random-filter", "--reweight"], ("--reweight", "--random-filter")),
    (["--random-filter", "--no-reweight"], ("--reweight", "--random-filter")),
    (["--algo", "sft", "--sft-data", "val", "--sft-coef", "1"], ("--sft-coef",)),
])
def test_flags_that_would_do_nothing_are_refused_naming_both(argv, named):
    with pytest.raises(SystemExit) as err:
        parse_config(argv)
    assert all(flag in str(err.value) for flag in named), str(err.value)


def test_the_same_flags_where_they_act_are_accepted():
    for argv in (["--vf-coef", "0.5", "--gamma", "1.0"], ["--stop-below-kept", "0.1"], ["--no-reweight"],
                 ["--speedups", "off"], ["--advantage", "grpo", "--speedups", "all"]):
        parse_config(argv)


def test_eval_split_val_is_refused_under_i_ppo_and_dev_holds_out_rows_from_everything(tiny_dir, tmp_path):
    with pytest.raises(SystemExit, match="--eval-split.*g_val.*--eval-split dev"):
        parse_config(["--eval-split", "val"])
    parse_config(["--eval-split", "val", "--influence", "off"])
    run_dir = train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "r"), "--eval-split", "dev",
                          "--eval-limit", "3", "--val-size", "4", "--iterations", "2", "--eval-every", "1",
                          "--prompts-per-iter", "8", "--samples-per-prompt", "2", "--max-new-tokens", "4",
                          "--eval-max-new-tokens", "4", "--data-source", "local", "--no-progress", "--no-plots"])
    rows = json.loads((run_dir / "data.json").read_text())
    assert len(rows["eval_rows"]) == 3 and len(rows["val_rows"]) == 4
    assert not set(rows["eval_rows"]) & set(rows["val_rows"])
    trained = {json.loads(line)["prompt"] for line in (run_dir / "episodes.jsonl").read_text().splitlines()}
    from tasks import load_task
    by_where = {e.where: e.question for e in load_task("gsm8k", "train", "local").examples}
    assert not trained & {by_where[w] for w in rows["eval_rows"] + rows["val_rows"]}


def test_a_config_json_from_before_the_renames_is_read_under_the_new_names(tmp_path):
    """A run directory written before --reference became --score-against and --passes became
    --speedups resumes with the same settings; one whose old setting has no exact new one is
    refused naming both."""
    from config import renamed_settings
    old = {"reference": "batch-loo", "passes": "shared", "influence_method": "onepass", "lr": 1e-3}
    assert renamed_settings(tmp_path, old) == {"score_against": "batch-loo", "speedups": "all", "lr": 1e-3}
    assert renamed_settings(tmp_path, {"lr": 1e-3}) == {"lr": 1e-3}
    with pytest.raises(SystemExit, match="--influence-method loop, which is now --speedups off"):
        renamed_settings(tmp_path, {"influence_method": "loop"})
