"""The critic's defaults (lambda 1, a value learning rate of its own, no value clipping, a floor
under the whitening), the PPO health diagnostics against independent computations, and
sampling from exactly the distribution whose log-probs PPO uses."""
import json
import math
import shutil
from types import SimpleNamespace

import pytest
import torch

import logbook
import optim
import train
from config import Config
from model import load_policy
from ppo import value_loss
from rollout import generate_rollouts, old_and_ref_logprobs

pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py: one intra-op thread


def batch(scores, lengths, values=None, T=6):
    """Episodes of the given lengths with a fresh critic (V = 0) and pi_old = pi_ref (KL 0)."""
    mask = torch.zeros(len(lengths), T)
    for i, L in enumerate(lengths):
        mask[i, :L] = 1
    logprobs = -torch.rand(len(lengths), T, generator=torch.Generator().manual_seed(0)) * mask
    return SimpleNamespace(response_mask=mask, old_logprobs=logprobs, ref_logprobs=logprobs.clone(),
                           values=(torch.zeros_like(mask) if values is None else values * mask)), torch.tensor(scores)


def advantages_and_critic(cfg, rollouts, scores):
    """train.compute_advantages on a batch, and logbook's critic metrics of it."""
    buf = train.Buffer([], rollouts, rewards=scores)
    advantages, buf.returns, _, buf.raw_advantages = train.compute_advantages(cfg, buf)
    return advantages, buf.returns, logbook.critic_metrics(cfg, buf)


def test_default_advantages_give_every_token_the_outcome():
    """With a fresh critic, lambda 1 gives each token A_t = R: the first token of a long answer
    gets the same credit as the last (lambda 0.95 gave it 0.95^(L-1) of it)."""
    rollouts, scores = batch([1.0, 0.0, 1.0, 0.0], [6, 2, 3, 5])
    advantages, _, critic = advantages_and_critic(Config(), rollouts, scores)
    mask = rollouts.response_mask.bool()
    for i in range(4):
        row = advantages[i][mask[i]]
        assert torch.allclose(row, row[0].expand_as(row)), row          # one value per episode
    assert advantages[0, 0] > 0 > advantages[1, 0]
    # before whitening every token carries its episode's score: mean = (6 + 3) / 16 tokens
    assert critic["advantage_mean"] == pytest.approx(9 / 16)


def test_critic_diagnostics_against_a_direct_computation():
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]] * 3)
    rollouts, scores = batch([1.0, 0.0, 1.0], [6, 2, 3], values=values)
    _, returns, critic = advantages_and_critic(Config(), rollouts, scores)
    # gamma = lambda = 1 and KL 0: R_t = score, A_t = score - V_t, over the 11 response tokens
    tokens = [(1.0, v) for v in [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]] + [(0.0, 0.1), (0.0, 0.2)] + \
             [(1.0, 0.1), (1.0, 0.2), (1.0, 0.3)]
    adv = [r - v for r, v in tokens]
    assert critic["advantage_mean"] == pytest.approx(sum(adv) / 11)

    def var(xs):
        m = sum(xs) / len(xs)
        return sum((x - m) ** 2 for x in xs) / len(xs)
    assert critic["explained_variance"] == pytest.approx(1 - var(adv) / var([r for r, _ in tokens]), rel=1e-5)


def test_whitening_floor_keeps_equal_rewards_from_becoming_full_steps():
    noise = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)) * 0.01 + 0.3
    rollouts, scores = batch([0.0, 0.0, 0.0, 0.0], [6, 4, 5, 3], values=noise)
    advantages, _, _, _ = train.compute_advantages(Config(), train.Buffer([], rollouts, rewards=scores))
    assert advantages.abs().max() < 0.5                    # unfloored whitening: std 1, max ~2
    plain, _, _, _ = train.compute_advantages(Config(adv_std_floor=0.0), train.Buffer([], rollouts, rewards=scores))
    assert plain[rollouts.response_mask.bool()].std() > 0.9


def test_value_head_has_its_own_learning_rate(tiny_dir):
    policy, _ = load_policy(tiny_dir, quiet=True)
    cfg = Config()
    optimizer = optim.make_optimizer(cfg, policy)
    by_lr = {group["lr"]: group["params"] for group in optimizer.param_groups}
    assert set(by_lr) == {cfg.lr, cfg.value_lr} and cfg.value_lr > cfg.lr
    assert {id(p) for p in by_lr[cfg.value_lr]} == {id(p) for p in policy.value_head.parameters()}
    trainable = [p for p in policy.parameters() if p.requires_grad]
    assert sum(len(ps) for ps in by_lr.values()) == len(trainable)


def test_default_value_loss_is_not_clipped():
    """A critic at V = 0.5 after a few steps, return 1: the default still pulls it towards 1
    (a value clip of 0.2 around V_old = 0 would give it no gradient at all)."""
    values = torch.full((1, 2), 0.5, requires_grad=True)
    loss = value_loss(values, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), Config().value_clip_eps)
    loss.sum().backward()
    assert values.grad[0].tolist() == pytest.approx([-0.25, -0.25])


# ----------------------------------------------------------------------------- update diagnostics

SMALL = ["--prompts-per-iter", "2", "--samples-per-prompt", "3", "--max-new-tokens", "8", "--val-size", "4",
         "--truncation-penalty", "1", "--minibatch-size", "4", "--micro-batch-size", "2", "--no-progress",
         "--data-source", "local", "--eval-every", "0"]


def test_diagnostics_are_logged(tiny_dir, tmp_path, capsys):
    run_dir = train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "r"), "--iterations", "1", *SMALL])
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert row["ratio_first_mean"] == pytest.approx(1.0, abs=1e-5)
    assert row["ratio_first_max"] == pytest.approx(1.0, abs=1e-5)
    assert row["approx_kl"] >= 0 and (row["explained_variance"] is None or math.isfinite(row["explained_variance"]))
    assert "advantage_mean" in row
    line = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[it   1/1]")][0]
    assert " akl " in line and " ratio0 " in line and " ev " in line and " adv " in line


def test_ratio_and_kl_diagnostics_see_wrong_old_logprobs(tiny_dir):
    """Old log-probs shifted by +0.1 on every token: the first-minibatch ratio must read
    exp(-0.1), and with a policy that does not move (lr 1e-30) the approximate KL of every
    visit is exp(-0.1) - 1 + 0.1."""
    cfg = Config(model=tiny_dir, lr=1e-30, value_lr=1e-30, minibatch_size=2, micro_batch_size=2,
                       progress=False)
    policy, tok = load_policy(tiny_dir, quiet=True)
    rollouts = generate_rollouts(policy, tok, ["Question: 1 + 2\nAnswer:", "Question: 3 + 4\nAnswer:"], n_samples=2,
                                 max_new_tokens=6, temperature=1.0, seed=0, progress=False)
    rollouts.old_logprobs, rollouts.values, rollouts.ref_logprobs = old_and_ref_logprobs(policy, rollouts, 1.0, 16)
    rollouts.old_logprobs = rollouts.old_logprobs + 0.1 * rollouts.response_mask
    N = len(rollouts)
    advantages = torch.ones_like(rollouts.response_mask) * rollouts.response_mask
    buf = train.Buffer([], rollouts, advantages=advantages, returns=advantages.clone(),
                       keep=torch.ones(N, dtype=torch.bool), weights=torch.ones(N))
    buf.update = train.ppo_update(0, cfg, policy, optim.make_optimizer(cfg, policy), buf, train.passes_for(0, cfg))
    update = logbook.update_metrics(cfg, buf)
    assert update["ratio_first_mean"] == pytest.approx(math.exp(-0.1), abs=1e-5)
    assert update["ratio_first_max"] == pytest.approx(math.exp(-0.1), abs=1e-5)
    assert update["approx_kl"] == pytest.approx(math.exp(-0.1) - 1 + 0.1, abs=1e-6)


# ----------------------------------------------------------------------------- sampling

def test_sampled_logprobs_are_those_of_the_sampling_distribution(tiny_dir, tmp_path):
    """A model whose generation_config sets repetition_penalty 2.0: the episodes must still be
    drawn from softmax(logits / T), the distribution whose log-probs PPO records as pi_old. The
    sampler's own log-probs of the tokens it drew (what it sampled from) are compared with
    old_logprobs; a repetition penalty applied while sampling would show as a gap."""
    from transformers import GenerationConfig

    model_dir = tmp_path / "penalised"
    shutil.copytree(tiny_dir, model_dir)
    GenerationConfig(repetition_penalty=2.0, no_repeat_ngram_size=2).save_pretrained(model_dir)
    policy, tok = load_policy(str(model_dir), quiet=True)
    assert policy.lm.generation_config.repetition_penalty == 2.0
    rollouts = generate_rollouts(policy, tok, ["Question: 12 + 34\nAnswer:", "Question: 5 - 3\nAnswer:"],
                                 n_samples=3, max_new_tokens=12, temperature=0.8, seed=0, batch_size=16,
                                 progress=False)
    rollouts.old_logprobs, rollouts.values, rollouts.ref_logprobs = old_and_ref_logprobs(policy, rollouts, 0.8, 16)
    mask = rollouts.response_mask.bool()
    torch.testing.assert_close(rollouts.sampler_logprobs[mask], rollouts.old_logprobs[mask], rtol=1e-4, atol=1e-4)
    assert policy.lm.generation_config.repetition_penalty == 2.0               # the model's config is untouched
