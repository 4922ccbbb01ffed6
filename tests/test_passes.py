"""No pass whose result is unused: skipping one changes nothing but the time."""
import json

import pytest

import rollout
import speedups
import train
from test_train import SMALL, comparable, metrics

pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py: one intra-op thread

SPEEDUPS = {"separate": "on", "shared": "all"}   # pi_old from its own pass, or from a forward that runs anyway


def test_no_reference_pass_at_kl_beta_0_and_nothing_else_changes(tiny_dir, tmp_path, monkeypatch):
    calls = []
    real = rollout.old_and_ref_logprobs

    def counting(policy, seqs, temperature, batch_size, ref=True, **kw):
        calls.append(ref)
        return real(policy, seqs, temperature, batch_size, ref, **kw)

    monkeypatch.setattr(speedups, "old_and_ref_logprobs", counting)
    args = ["--model", tiny_dir, *SMALL, "--iterations", "2", "--eval-every", "0", "--kl-beta", "0", "--lr", "1e-2",
            "--speedups", "on"]
    skipped = train.main([*args, "--run-dir", str(tmp_path / "skipped")])
    assert calls == [False, False]
    # The same run with the reference pass forced back in: identical but for the logged KL.
    monkeypatch.setattr(speedups, "old_and_ref_logprobs", lambda p, s, t, b, ref=True, **kw: real(p, s, t, b, True, **kw))
    full = train.main([*args, "--run-dir", str(tmp_path / "full")])
    a, b = metrics(skipped), metrics(full)
    assert all("kl" not in m for m in a) and all("kl" in m for m in b[1:])
    assert [comparable(m) for m in a] == [{k: v for k, v in comparable(m).items() if k != "kl"} for m in b]
    episodes = lambda d: (d / "episodes.jsonl").read_text()   # noqa: E731
    assert episodes(skipped) == episodes(full)
    assert json.loads((skipped / "config.json").read_text())["kl_beta"] == 0


def close(a, b, tol=1e-6):
    """Equal up to `tol` relative (numbers), exactly (anything else), recursively."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= tol * max(1.0, abs(a), abs(b))
    return a == b


def test_shared_and_separate_passes_give_the_same_run(tiny_dir, tmp_path):
    """--speedups all takes pi_old and V_old from the influence scoring's forward; the run must
    equal the one with the separate no-grad pass: old log-probs (through the ratios and the
    KL), values (through the advantages), scores, kept sets, weights and updated parameters."""
    from safetensors.torch import load_file
    runs = {}
    for passes in ("separate", "shared"):
        runs[passes] = train.main(["--model", tiny_dir, *SMALL, "--iterations", "2", "--eval-every", "0", "--lr", "1e-2",
                                   "--kl-beta", "0.05", "--speedups", SPEEDUPS[passes], "--run-dir", str(tmp_path / passes)])
    a, b = metrics(runs["separate"]), metrics(runs["shared"])
    assert [m["iteration"] for m in a] == [1, 2]
    assert any(m["policy_loss"] != 0 for m in a) and all("score_mean" in m for m in a)
    assert a[0]["kl"] == b[0]["kl"] == 0.0     # pi_ref and pi_old over the same batches: exactly 0 at the start
    # The run's summaries at 1e-5: some divide by a spread (explained variance by Var(R), the
    # weights' ESS by sum w^2), which turns a 1e-7 difference in V_old into 1.4e-6 on some CPUs.
    # The quantities themselves (scores, weights, parameters; old log-probs and values in the
    # next test) are held to 1e-6.
    for x, y in zip(a, b):
        assert close(comparable(x), comparable(y), tol=1e-5), (comparable(x), comparable(y))
    ea = [json.loads(l) for l in (runs["separate"] / "episodes.jsonl").read_text().splitlines()]
    eb = [json.loads(l) for l in (runs["shared"] / "episodes.jsonl").read_text().splitlines()]
    assert [(e["response"], e["kept"]) for e in ea] == [(e["response"], e["kept"]) for e in eb]
    assert close([e["score"] for e in ea], [e["score"] for e in eb])
    # w_i = s_i / mean(kept s) divides by a mean that can be small: the weights are held to the
    # scores' 1e-6 carried through that division (1e-6 * max|s| / mean(kept s), per iteration).
    for it in {e["iteration"] for e in ea}:
        s = [e["score"] for e in ea if e["iteration"] == it]
        kept = [x for x in s if x > 0]
        tol = 1e-6 * max(1.0, *map(abs, s)) / (sum(kept) / len(kept)) if kept else 1e-6
        assert close([e["weight"] for e in ea if e["iteration"] == it],
                     [e["weight"] for e in eb if e["iteration"] == it], tol), it
    # Updated parameters: 1e-6 after the first iteration. The second's kept scores average about
    # 0.005, so the weights carry the scores' rounding 200-fold (above) and the step passes it
    # on: 1e-5 there (seen: 2.9e-6 on one CPU, under 1e-6 on another).
    for it, tol in ((1, 1e-6), (2, 1e-5)):
        ta = load_file(runs["separate"] / "checkpoints" / f"iter_{it:06d}" / "adapter.safetensors")
        tb = load_file(runs["shared"] / "checkpoints" / f"iter_{it:06d}" / "adapter.safetensors")
        for name in ta:
            assert (ta[name] - tb[name]).abs().max() <= tol * max(1.0, ta[name].abs().max().item()), (it, name)


def test_the_scoring_forward_gives_the_old_pass_numbers(tiny_dir):
    """On one buffer: log pi_old and V_old of the forwards at theta_old (the update's, the
    scoring's) equal the no-grad pass's, and the scores from the scoring's backwards equal
    onepass_scores', to 1e-6."""
    import torch
    from influence import validation_gradient
    from model import load_policy, lora_parameters
    from rollout import encode_pairs, generate_rollouts, old_and_ref_logprobs
    from speedups import onepass_scores, scoring_backward, theta_old_forwards
    policy, tok = load_policy(tiny_dir, quiet=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in lora_parameters(policy):
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        policy.value_head.weight.copy_(torch.randn(policy.value_head.weight.shape, generator=g))
    buf = generate_rollouts(policy, tok, ["Question: 12+30?\nAnswer:", "Q: 7?", "What is 1 more than 99?"],
                            n_samples=3, max_new_tokens=9, temperature=0.8, seed=1, progress=False, batch_size=4)
    buf.old_logprobs, buf.values, buf.ref_logprobs = old_and_ref_logprobs(policy, buf, 0.8, 4)
    old, values = buf.old_logprobs.clone(), buf.values.clone()
    for scoring in (False, True):       # the update's first forward, then the scoring's
        order = torch.randperm(len(buf), generator=g) if not scoring else torch.arange(len(buf))
        forwards = theta_old_forwards(policy, buf, order, batch_size=4, temperature=0.8, scoring=scoring,
                                      ref=False)
        # fp32 rounding of forwards over other batch shapes: a few 1e-6 on log-probs of size 1-10
        torch.testing.assert_close(buf.old_logprobs, old, rtol=2e-6, atol=5e-6)
        torch.testing.assert_close(buf.values, values, rtol=2e-6, atol=5e-6)
    advantages = torch.randn(buf.response_mask.shape, generator=g) * buf.response_mask
    g_val = validation_gradient(policy, encode_pairs(tok, ["Q: 2+2?"], ["#### 4"]))
    shared = scoring_backward(policy, forwards, buf.old_logprobs, advantages, g_val, clip_eps=0.2)
    separate = onepass_scores(policy, buf, advantages, g_val, clip_eps=0.2, temperature=0.8, batch_size=4)
    assert ((shared - separate).abs().max() / separate.abs().max()).item() <= 1e-6


@pytest.mark.parametrize("advantage, kl_beta", [("grpo", "0"), ("gae", "0"), ("gae", "0.05")])
def test_without_influence_pi_old_comes_from_the_update_and_equals_the_separate_pass(tiny_dir, tmp_path, monkeypatch,
                                                                                  advantage, kl_beta):
    """No influence, one minibatch of every episode: no old-log-prob pass in the rollout (the
    update's first forward, run ahead of the advantages, gives pi_old and V_old; the reference
    pass only at beta > 0), and the run equals the one with the separate pass, 2 epochs."""
    from safetensors.torch import load_file
    calls = []
    real = rollout.old_and_ref_logprobs

    def counting(policy, seqs, temperature, batch_size, ref=True, old=True, **kw):
        calls.append((ref, old))
        return real(policy, seqs, temperature, batch_size, ref, old, **kw)

    monkeypatch.setattr(speedups, "old_and_ref_logprobs", counting)
    runs = {}
    for passes in ("separate", "shared"):
        calls.clear()
        runs[passes] = train.main(["--model", tiny_dir, *SMALL, "--iterations", "2", "--eval-every", "0", "--lr", "1e-2",
                                   "--advantage", advantage, "--influence", "off", "--kl-beta", kl_beta,
                                   "--minibatch-size", "6", "--ppo-epochs", "2", "--speedups", SPEEDUPS[passes],
                                   "--run-dir", str(tmp_path / passes)])
        with_ref = kl_beta != "0"
        # shared: pi_ref, when used, comes with pi_old from speedups.theta_old_forwards (same micro-batches)
        assert calls == ([(with_ref, True)] * 2 if passes == "separate" else [])
    a, b = metrics(runs["separate"]), metrics(runs["shared"])
    assert any(m["policy_loss"] != 0 for m in a) and all(m["optimizer_steps"] == 2 for m in a)
    assert all(m["ratio_first_max"] == 1.0 for m in b)     # pi_old is the first forward itself
    if kl_beta != "0":
        assert a[0]["kl"] == b[0]["kl"] == 0.0     # pi_ref and pi_old over the same batches: exactly 0 at the start
    if advantage == "gae":
        assert any(m["value_loss"] != 0 for m in a)      # the critic trains, from V_old of the shared forward
    for x, y in zip(a, b):   # summaries at 1e-5: explained variance divides by Var(R) (as above)
        assert close(comparable(x), comparable(y), tol=1e-5), (comparable(x), comparable(y))
    for it in (1, 2):   # updated parameters
        ta = load_file(runs["separate"] / "checkpoints" / f"iter_{it:06d}" / "adapter.safetensors")
        tb = load_file(runs["shared"] / "checkpoints" / f"iter_{it:06d}" / "adapter.safetensors")
        for name in ta:  # fp32 rounding: the two paths sum in other orders
            assert (ta[name] - tb[name]).abs().max() <= 2e-6 * max(1.0, ta[name].abs().max().item()), (it, name)


@pytest.mark.parametrize("influence", ["on", "off"])
def test_the_default_path_is_the_algorithm_box(tiny_dir, tmp_path, monkeypatch, influence):
    """By default pi_old and V_old come from the rollout phase's no-grad pass, as the algorithm
    box has them: no forward is shared between phases, and the log shows the box's phases only.
    --speedups all adds its own timed phase (the scoring forward is not hidden in "rollout")."""
    def refuse(*args, **kwargs):
        raise AssertionError("theta_old_forwards ran on the default path")

    args = ["--model", tiny_dir, *SMALL, "--iterations", "1", "--eval-every", "0", "--influence", influence,
            "--minibatch-size", "6"]
    with monkeypatch.context() as m:
        m.setattr(speedups, "theta_old_forwards", refuse)
        plain = metrics(train.main([*args, "--run-dir", str(tmp_path / "plain")]))[-1]
    assert list(plain["seconds"]) == ["rollout", "reward", "advantages", "influence", "update"]
    assert json.loads((tmp_path / "plain" / "config.json").read_text())["speedups"] == "on"
    shared = metrics(train.main([*args, "--speedups", "all", "--run-dir", str(tmp_path / "shared")]))[-1]
    assert list(shared["seconds"]) == ["rollout", "reward", "shared_forward", "advantages", "influence", "update"]
