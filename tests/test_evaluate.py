"""evaluate.py: pass@k against brute force, maj@k and its tie rule, metric parsing, standard
errors, greedy decoding against a hand-written loop, and the CLI end to end on the tiny model."""
import itertools
import json
import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tasks
import evaluate as ev
import reward
import accuracy
from accuracy import majority_vote, parse_metrics, pass_at_k, score_predictions


# ----------------------------------------------------------------------------- pass@k

def brute_force_pass_at_k(n, c, k):
    """The fraction of all k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 10])
def test_pass_at_k_equals_enumeration_over_all_k_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_the_exact_binomial_ratio(nck):
    n, c, k = nck
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9, abs=1e-12)


def test_pass_at_k_known_values_and_bad_input():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 6, 5) == 1.0          # 4 wrong samples cannot fill 5 slots
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)   # only {wrong, wrong} of 6 pairs fails
    assert 0 < pass_at_k(1000, 1, 500) < 1      # large n: no overflow, no C(1000, 500) formed
    for n, c, k in [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


# ----------------------------------------------------------------------------- maj@k

def test_majority_vote_hand_made_cases():
    assert majority_vote(["3", "5", "5"]) == "5"
    assert majority_vote(["5"]) == "5"
    assert majority_vote([None, None, "7"]) == "7"               # unparsed answers never win
    assert majority_vote([None, None, None]) is None
    assert majority_vote([]) is None


def test_majority_vote_tie_goes_to_the_answer_seen_first():
    assert majority_vote(["3", "5"]) == "3"
    assert majority_vote(["5", "3"]) == "5"
    assert majority_vote([None, "4", "9", "9", "4"]) == "4"       # 2-2 tie: "4" appeared first
    assert majority_vote(["1", "2", "2", "1", "3", "3", "3"]) == "3"   # no tie: plain majority


def record(gold, preds, greedy=None):
    samples = [{"pred": p, "correct": reward.is_correct(p, gold, "gsm8k"), "truncated": False} for p in preds]
    return {"question": "q", "gold": gold, "samples": samples,
            "pred": greedy, "correct": reward.is_correct(greedy, gold, "gsm8k"), "truncated": False}


def test_maj_and_pass_counted_from_hand_made_records():
    predictions = [
        record("5", ["5", "3", "3", "5"], greedy="5"),   # maj@2 tie 5/3 -> "5" (first): correct; maj@4 tie -> "5"
        record("3", ["5", "3", "3", "5"], greedy="1"),   # maj@2 tie -> "5": wrong; maj@4 tie -> "5": wrong
        record("8", [None, None, None, None]),           # no parsed answer: no vote, wrong
        record("2", [None, "2", "4", "2"], greedy="2"),  # maj@2 -> "2" (None never wins): correct; maj@4 -> "2"
    ]
    results = score_predictions(predictions, parse_metrics("em,maj@2,maj@4,pass@1,pass@4"), "gsm8k")
    assert [p["maj@2"]["vote"] for p in predictions] == ["5", "5", None, "2"]
    assert [p["maj@4"]["vote"] for p in predictions] == ["5", "5", None, "2"]
    assert results["maj@2"]["n_correct"] == 2 and results["maj@2"]["value"] == 0.5
    assert results["maj@2"]["n_no_vote"] == 1
    assert results["em"]["n_correct"] == 2 and results["em"]["n_unparsed"] == 1
    # pass@1 is the mean fraction of correct samples; pass@4 with n = 4 is "any correct".
    assert results["pass@1"]["value"] == pytest.approx((2 / 4 + 2 / 4 + 0 + 2 / 4) / 4)
    assert results["pass@4"]["value"] == pytest.approx(3 / 4)
    assert [p["pass@4"] for p in predictions] == [1.0, 1.0, 0.0, 1.0]


def test_maj_uses_the_first_k_samples():
    predictions = [record("1", ["1", "2", "2", "2"])]
    results = score_predictions(predictions, [("maj", 1), ("maj", 4)], "gsm8k")
    assert predictions[0]["maj@1"]["vote"] == "1" and results["maj@1"]["value"] == 1.0
    assert predictions[0]["maj@4"]["vote"] == "2" and results["maj@4"]["value"] == 0.0


def test_standard_errors():
    # em / maj: binomial sqrt(p (1 - p) / N); pass@k: SE of the mean of the per-problem estimates.
    predictions = [record("1", ["1", "0"], greedy="1"), record("1", ["0", "0"], greedy="0"),
                   record("1", ["1", "1"], greedy="0"), record("1", ["0", "1"], greedy="0")]
    results = score_predictions(predictions, parse_metrics("em,pass@1,pass@2"), "gsm8k")
    assert results["em"]["stderr"] == pytest.approx(math.sqrt(0.25 * 0.75 / 4))
    estimates = [0.5, 0.0, 1.0, 0.5]
    mean = sum(estimates) / 4
    assert results["pass@1"]["stderr"] == pytest.approx(math.sqrt(sum((e - mean) ** 2 for e in estimates) / 4 / 4))
    # With 0/1 estimates (pass@2 from 2 samples) it is the binomial formula.
    assert results["pass@2"]["value"] == 0.75
    assert results["pass@2"]["stderr"] == pytest.approx(math.sqrt(0.75 * 0.25 / 4))


# ----------------------------------------------------------------------------- parsing

def test_parse_metrics():
    assert parse_metrics("em") == [("em", None)]
    assert parse_metrics("em,maj@8,pass@8") == [("em", None), ("maj", 8), ("pass", 8)]
    assert parse_metrics(" pass@1 , maj@16 ") == [("pass", 1), ("maj", 16)]
    for bad, says in [("maj@0", "K must be"), ("pass@-1", "K must be"), ("pass@x", "K must be"), ("maj@", "K must be"),
                      ("foo", "not a metric"), ("em@3", "not a metric"), ("maj", "not a metric"), ("", "not a metric"),
                      ("em,,maj@2", "not a metric"), ("em,em", "more than once"), ("maj@2,maj@02", "more than once")]:
        with pytest.raises(ValueError, match=says):
            parse_metrics(bad)


# ----------------------------------------------------------------------------- with the tiny model

def greedy_by_hand(policy, tokenizer, prompt, max_new_tokens):
    """Independent greedy decoding: one prompt, no padding, no KV cache, argmax of full logits."""
    from model import eos_token_ids
    from rollout import encode_prompts
    ids, _ = encode_prompts(tokenizer, [prompt])
    new = []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = policy.lm(input_ids=ids).logits[0, -1]
        token = int(logits.argmax())
        if token in eos_token_ids(tokenizer):
            break
        new.append(token)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return tokenizer.decode(new, skip_special_tokens=True), len(new) == max_new_tokens


def test_train_run_eval_call_and_greedy_matches_a_hand_written_loop(tiny_policy):
    policy, tokenizer = tiny_policy
    examples = tasks.load_task("gsm8k", "test", "local").examples[:3]
    # The call accuracy.run_eval makes, and the keys it reads.
    result = accuracy.evaluate(policy, tokenizer, examples, "gsm8k", max_new_tokens=6, batch_size=2, progress=False)
    assert {"accuracy", "stderr", "n", "n_unparsed", "n_truncated"} <= set(result)
    assert result["n"] == 3 and result["metrics"]["em"]["value"] == result["accuracy"]
    for e, p in zip(examples, result["predictions"]):
        response, truncated = greedy_by_hand(policy, tokenizer, tasks.make_prompt(e.question, "gsm8k"), 6)
        assert (p["response"], p["truncated"]) == (response, truncated)
        assert p["pred"] == reward.extract_answer(response, "gsm8k")


def test_sampling_is_seeded_and_leaves_the_callers_rng_alone(tiny_policy):
    policy, tokenizer = tiny_policy
    examples = tasks.load_task("gsm8k", "test", "local").examples[:2]
    kw = dict(metrics="pass@2", max_new_tokens=5, batch_size=3, progress=False)
    state = torch.get_rng_state()
    a = accuracy.evaluate(policy, tokenizer, examples, "gsm8k", seed=1, **kw)
    assert torch.equal(torch.get_rng_state(), state)
    b = accuracy.evaluate(policy, tokenizer, examples, "gsm8k", seed=1, **kw)
    c = accuracy.evaluate(policy, tokenizer, examples, "gsm8k", seed=2, **kw)
    texts = lambda r: [s["response"] for p in r["predictions"] for s in p["samples"]]
    assert texts(a) == texts(b) and texts(a) != texts(c)
    assert a["n_samples"] == 2 and all(len(p["samples"]) == 2 for p in a["predictions"])
    assert "accuracy" not in a and "response" not in a["predictions"][0]   # em not asked: no greedy pass
    with pytest.raises(ValueError, match="samples=1"):
        accuracy.evaluate(policy, tokenizer, examples, "gsm8k", metrics="maj@2", samples=1, progress=False)


def test_cli_end_to_end(tiny_dir, tmp_path, capsys):
    out = tmp_path / "not" / "yet" / "eval.json"   # --out's folders are made as needed
    ev.main(["--model", tiny_dir, "--dataset", "gsm8k", "--data-source", "local", "--limit", "3", "--samples", "2",
             "--max-new-tokens", "8", "--metrics", "em,maj@2,pass@2", "--no-progress", "--out", str(out)])
    printed = capsys.readouterr().out
    for name in ("em", "maj@2", "pass@2"):
        assert f" {name} " in printed
    saved = json.loads(out.read_text())
    assert {"config", "data_source", "seconds", "n", "n_samples", "metrics", "predictions", "accuracy", "stderr",
            "n_unparsed", "n_truncated"} <= set(saved)
    assert saved["config"]["metrics"] == "em,maj@2,pass@2" and saved["config"]["seed"] == 0
    assert saved["n"] == 3 and saved["n_samples"] == 2 and len(saved["predictions"]) == 3
    for name in ("em", "maj@2", "pass@2"):
        m = saved["metrics"][name]
        assert 0 <= m["value"] <= 1 and m["stderr"] >= 0
    for p in saved["predictions"]:
        assert {"question", "gold", "response", "pred", "correct", "truncated", "samples", "maj@2", "pass@2"} <= set(p)
        assert len(p["samples"]) == 2
        for s in p["samples"]:
            assert s["pred"] == reward.extract_answer(s["response"], "gsm8k")
            assert s["correct"] == reward.is_correct(s["pred"], p["gold"], "gsm8k")
        assert p["maj@2"]["vote"] == majority_vote([s["pred"] for s in p["samples"]])
        assert p["pass@2"] == float(any(s["correct"] for s in p["samples"]))


def test_cli_adapter_from_a_run_directory(tiny_dir, tmp_path):
    import train
    run_dir = train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "run"), "--algo", "sft", "--iterations", "1",
                          "--eval-every", "0", "--val-size", "4", "--sft-batch-size", "2", "--no-progress",
                          "--data-source", "local"])
    out = tmp_path / "eval.json"
    saved = ev.main(["--adapter", str(run_dir), "--data-source", "local", "--limit", "2", "--max-new-tokens", "4",
                     "--no-progress", "--out", str(out)])
    assert saved["config"]["model"] == tiny_dir   # taken from the adapter
    assert saved["config"]["adapter_checkpoint"].endswith("iter_000001")
    with pytest.raises(SystemExit, match="neither a checkpoint"):
        ev.main(["--adapter", str(tmp_path), "--model", tiny_dir, "--out", str(out)])


@pytest.mark.parametrize("flags, says", [
    (["--metrics", "maj@0"], "--metrics"), (["--metrics", "foo"], "--metrics"),
    (["--limit", "-1"], "--limit"), (["--samples", "0"], "--samples"),
    (["--metrics", "em,pass@4", "--samples", "2"], "--samples"), (["--temperature", "0"], "--temperature"),
    (["--dataset", "nope"], "--dataset"),
])
def test_cli_refuses_bad_flags_before_loading_anything(flags, says, capsys):
    with pytest.raises(SystemExit) as err:
        ev.main(["--model", "/nonexistent", *flags])
    assert err.value.code == 2
    assert says in capsys.readouterr().err


# ----------------------------------------------------------------------------- faithful accuracy (arith)

def arith_responses(examples, kinds):
    """A response of each kind per example: the reference solution (faithful), the final line
    alone (right answer, no chain of steps: unfaithful), or a wrong answer."""
    made = {"faithful": lambda e: e.solution, "unfaithful": lambda e: f"#### {e.gold}",
            "wrong": lambda e: f"#### {int(e.gold) + 1}"}
    return [made[kind](e) for e, kind in zip(examples, kinds)]


def test_faithful_accuracy_of_greedy_answers_and_samples_by_hand():
    examples = tasks.generate_arith("test", terms=3)[:4]
    greedy = arith_responses(examples, ["faithful", "unfaithful", "wrong", "faithful"])
    samples = [["faithful", "faithful", "wrong"], ["unfaithful"] * 3, ["faithful", "wrong", "unfaithful"], ["wrong"] * 3]
    predictions = [{"response": g, "samples": [{"response": r} for r in arith_responses([e] * 3, kinds)]}
                   for e, g, kinds in zip(examples, greedy, samples)]
    summary = accuracy.reasoning_summary(predictions, examples)
    g, s = summary["greedy"], summary["samples"]
    assert [p["reasoning"] for p in predictions] == ["faithful", "unfaithful", "wrong", "faithful"]   # labels as meant
    # greedy: 2 of 4 problems correct and faithful; binomial stderr sqrt(0.5 * 0.5 / 4).
    assert g["faithful_accuracy"] == 0.5 and g["faithful_accuracy_stderr"] == pytest.approx(0.25)
    # = em x (1 - unfaithful share of the correct): 3/4 correct, 1 of the 3 unfaithful
    assert g["faithful_accuracy"] == pytest.approx(3 / 4 * (1 - g["unfaithful_of_correct"]))
    # samples: per problem 2/3, 0, 1/3, 0 faithful; mean 1/4; stderr of that mean over the 4
    # problems, population variance 11/144: sqrt(11/144 / 4) = sqrt(11) / 24.
    assert s["faithful_accuracy"] == pytest.approx(0.25)
    assert s["faithful_accuracy_stderr"] == pytest.approx(math.sqrt(11) / 24)
    assert (s["faithful"], s["unfaithful"], s["wrong"]) == (3, 4, 5)   # the old counts are still there


def test_cli_prints_faithful_accuracy_on_arith(tmp_path, capsys):
    out = tmp_path / "eval.json"
    saved = ev.main(["--model", "tiny-arith", "--dataset", "arith", "--arith-terms", "3", "--limit", "6",
                     "--metrics", "em,pass@2", "--max-new-tokens", "40", "--batch-size", "12", "--no-progress",
                     "--out", str(out)])
    printed = capsys.readouterr().out
    g, s = saved["reasoning"]["greedy"], saved["reasoning"]["samples"]
    assert g["faithful_accuracy"] == g["faithful"] / 6 == json.loads(out.read_text())["reasoning"]["greedy"][
        "faithful_accuracy"]
    faithful_share = [sum(x["reasoning"] == "faithful" for x in p["samples"]) / 2 for p in saved["predictions"]]
    assert s["faithful_accuracy"] == pytest.approx(sum(faithful_share) / 6)
    assert f"faithful accuracy (greedy) {g['faithful_accuracy']:.3f} +- {g['faithful_accuracy_stderr']:.3f}" in printed
    assert f"faithful accuracy (samples) {s['faithful_accuracy']:.3f} +- {s['faithful_accuracy_stderr']:.3f}" in printed
    assert saved["accuracy"] == saved["metrics"]["em"]["value"]   # the existing keys are unchanged
