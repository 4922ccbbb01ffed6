"""What PPO and I-PPO share, so that a comparison measures the filter and nothing else: the
critic's episodes (--critic-episodes), what the value loss trains (--critic-grad), the number
of optimizer steps, one temperature for g_i and g_val; and DTV's validation-free reference
(--score-against batch | batch-loo) against its per-episode oracle."""
import math
from pathlib import Path

import pytest
import torch

import influence
import optim
import train
from config import Config, parse_config
from influence import dtv_filter, episode_gradients, loop_batch_scores
from model import lora_parameters
from rollout import token_logprobs
from speedups import onepass_batch_scores, scoring_forward
from test_influence import TEMPERATURE, make_buffer


@pytest.fixture
def buffer(tiny_dir):
    return make_buffer(tiny_dir)


@pytest.mark.parametrize("loo", [False, True])
@pytest.mark.parametrize("micro", [1, 4, 6])
def test_onepass_batch_scores_equal_the_per_episode_oracle(buffer, loo, micro):
    policy, _, rollouts, advantages = buffer
    grads = episode_gradients(policy, rollouts, advantages, clip_eps=0.2, temperature=TEMPERATURE).double()  # (6, P)
    n = len(grads)
    if loo:   # each episode against the mean of the others, written out
        expected = torch.stack([grads[i] @ (grads.sum(0) - grads[i]) / (n - 1) for i in range(n)])
    else:
        expected = grads @ grads.mean(0)
    loop = loop_batch_scores(grads.float(), leave_one_out=loo)
    forwards = []
    for start in range(0, n, micro):
        index = torch.arange(start, min(start + micro, n))
        forwards.append(scoring_forward(policy, rollouts.select(index), TEMPERATURE))
        forwards[-1].index = index
    onepass = onepass_batch_scores(policy, forwards, rollouts.old_logprobs, advantages, clip_eps=0.2,
                                     leave_one_out=loo)
    scale = expected.abs().max().item()
    assert scale > 0
    torch.testing.assert_close(loop.double(), expected, rtol=1e-4, atol=1e-6 * scale)
    torch.testing.assert_close(onepass.double(), expected, rtol=1e-4, atol=1e-6 * scale)
    if not loo:   # the mean direction: every episode's score averages to |mean g|^2 > 0
        assert expected.mean().item() == pytest.approx(grads.mean(0).square().sum().item(), rel=1e-6)


def test_two_pass_batch_reference_of_the_gsm8k_probe_equals_the_oracle(buffer, monkeypatch):
    """experiments/filter-signal/filter_signal.py scores the 270M's batch reference in two passes (the mean gradient,
    then the one-pass contraction with it) so that no episode's forward is kept alive."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "experiments" / "filter-signal"))
    import filter_signal
    from speedups import onepass_scores
    policy, _, rollouts, advantages = buffer
    grads = episode_gradients(policy, rollouts, advantages, clip_eps=0.2, temperature=TEMPERATURE).double()
    mean_g = filter_signal.mean_episode_gradient(policy, rollouts, advantages, clip_eps=0.2,
                                                 temperature=TEMPERATURE, batch_size=4)
    torch.testing.assert_close(mean_g.double(), grads.mean(0), rtol=1e-4, atol=1e-7)
    two_pass = onepass_scores(policy, rollouts, advantages, mean_g, clip_eps=0.2, temperature=TEMPERATURE, batch_size=4)
    expected = grads @ grads.mean(0)
    torch.testing.assert_close(two_pass.double(), expected, rtol=1e-4, atol=1e-6 * expected.abs().max().item())


def test_dtv_filter_keeps_nonnegative_scores_at_weight_one():
    keep, weights = dtv_filter(torch.tensor([0.5, 0.0, -1e-9, 2.0]))
    assert keep.tolist() == [True, True, False, True]
    assert weights.tolist() == [1.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize("critic_grad", ["head", "adapters"])
def test_the_value_loss_reaches_the_adapters_only_when_asked(buffer, critic_grad):
    policy, _, rollouts, _ = buffer
    policy.value_through_adapters = critic_grad == "adapters"
    torch.nn.init.normal_(policy.value_head.weight)
    _, values, _ = token_logprobs(policy, rollouts, TEMPERATURE)
    grads = torch.autograd.grad(values.square().sum(), lora_parameters(policy) + [policy.value_head.weight],
                                allow_unused=True)
    lora_norm = sum(0.0 if g is None else g.norm().item() for g in grads[:-1])
    assert grads[-1].norm() > 0                          # the head always learns
    assert (lora_norm > 0) == (critic_grad == "adapters")


def update(buffer, cfg: Config, keep, returns):
    """One ppo_update on the buffer; returns the value head's and the adapters' new tensors."""
    policy, _, rollouts, advantages = buffer
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in policy.trainable_state().items()}
    optimizer = optim.make_optimizer(cfg, policy)
    weights = keep.float()
    buf = train.Buffer([], rollouts, advantages=advantages, returns=returns, keep=keep, weights=weights)
    metrics = train.ppo_update(1, cfg, policy, optimizer, buf, train.passes_for(1, cfg))
    after = {k: v.clone() for k, v in policy.trainable_state().items()}
    policy.load_state_dict(state, strict=False)
    return after, metrics


@pytest.mark.parametrize("critic_episodes", ["all", "kept"])
def test_the_critic_learns_from_the_episodes_it_is_told(buffer, critic_episodes):
    """Changing the returns of dropped episodes changes the update with --critic-episodes all,
    and leaves it bit for bit the same with kept."""
    _, _, rollouts, _ = buffer
    cfg = Config(critic_episodes=critic_episodes, minibatch_size=6, micro_batch_size=2, ppo_epochs=1, lr=1e-2)
    keep = torch.tensor([True, False, True, False, True, False])
    returns = torch.ones_like(rollouts.response_mask) * rollouts.response_mask
    other = returns.clone()
    other[~keep] *= -3.0                                  # only the dropped episodes' returns differ
    a, _ = update(buffer, cfg, keep, returns)
    b, _ = update(buffer, cfg, keep, other)
    same = all(torch.equal(a[k], b[k]) for k in a if k.startswith("value_head"))
    assert same == (critic_episodes == "kept")
    for k in a:   # the policy side never sees the dropped episodes (the head alone reads them)
        if "lora_" in k:
            assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("n_kept", [6, 3, 1])
def test_every_filter_takes_the_same_optimizer_steps(buffer, n_kept):
    cfg = Config(minibatch_size=2, micro_batch_size=2, ppo_epochs=2, lr=1e-3)
    keep = torch.arange(6) < n_kept
    _, metrics = update(buffer, cfg, keep, torch.zeros_like(buffer[2].response_mask))
    assert metrics["steps"] == 2 * math.ceil(6 / 2)


def test_a_minibatch_keeps_the_samples_of_a_prompt_together():
    """32 prompts x 4 samples, minibatches of 64 in micro-batches of 16: every minibatch is a
    random draw, listed in buffer order, so a prompt's samples that were drawn together sit
    in one micro-batch (and share their prompt's forward) instead of being scattered."""
    cfg = Config(minibatch_size=64, micro_batch_size=16, ppo_epochs=2)
    every = torch.ones(128, dtype=torch.bool)
    steps = train.minibatch_plan(3, cfg, every, every)
    assert len(steps) == 4
    for _, _, _, mb in steps:
        assert torch.equal(mb, mb.sort().values)
        prompts_per_micro = [len(torch.unique(micro // 4)) for micro in mb.split(cfg.micro_batch_size)]
        assert sum(prompts_per_micro) <= 64 - 16       # scattered at random they would fill about 60
    assert sorted(torch.cat([mb for *_, mb in steps[:2]]).tolist()) == list(range(128))


def test_g_val_is_taken_at_the_sampling_temperature(buffer, monkeypatch):
    policy, tok, rollouts, advantages = buffer
    from rollout import encode_pairs
    val = encode_pairs(tok, ["Q: 2+2?", "Q: 10-3?"], ["#### 4", "10 - 3 = 7\n#### 7"])
    seen = []
    real = influence.validation_gradient   # speedups.Passes calls it there (the default --speedups on)
    monkeypatch.setattr(influence, "validation_gradient", lambda *a, **k: seen.append(k["temperature"]) or real(*a, **k))
    cfg = Config(temperature=TEMPERATURE, micro_batch_size=4)
    train.validation_scores(1, cfg, policy, rollouts, advantages, val, train.passes_for(1, cfg))
    assert seen == [TEMPERATURE]


@pytest.mark.parametrize("argv, named", [
    (["--score-against", "batch", "--no-reweight"], "--reweight"),
    (["--influence", "off", "--critic-episodes", "kept"], "--critic-episodes"),
    (["--influence", "off", "--score-against", "batch"], "--score-against"),
    (["--advantage", "grpo", "--critic-grad", "adapters"], "--critic-grad"),
])
def test_flags_that_would_do_nothing_are_refused(argv, named):
    with pytest.raises(SystemExit, match=named):
        parse_config(argv)


@pytest.mark.parametrize("reference", ["batch", "batch-loo"])
def test_a_dtv_run_scores_the_same_by_loop_and_by_one_pass(tiny_dir, tmp_path, reference):
    """train.py --score-against: the per-episode loop and the one-pass scores (shared forwards)
    agree in the run's first iteration, the kept set is s >= 0 and every kept weight is 1."""
    import json
    from test_train import SMALL
    runs = {}
    for method, speedups in (("loop", "off"), ("onepass", "on")):
        run = train.main(["--model", tiny_dir, *SMALL, "--iterations", "1", "--eval-every", "0", "--lr", "1e-2",
                          "--kl-beta", "0", "--score-against", reference, "--speedups", speedups,
                          "--run-dir", str(tmp_path / method)])
        runs[method] = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    loop, onepass = ([e["score"] for e in runs[m]] for m in ("loop", "onepass"))
    scale = max(abs(s) for s in loop)
    assert scale > 0
    assert onepass == pytest.approx(loop, rel=1e-4, abs=1e-6 * scale)
    for e in runs["onepass"]:
        assert e["kept"] == (e["score"] >= 0) and e["weight"] == (1.0 if e["kept"] else 0.0)
