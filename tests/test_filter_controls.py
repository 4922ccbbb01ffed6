"""What the filter is, checked on the step ppo_update actually takes, and the controls that test it.

With s_i = g_i . g_val and w_i = s_i / mean_{j kept} s_j, the first optimizer step of an
I-PPO update (theta = theta_old, ratio 1) has the LoRA gradient
    (1/|D'|) sum_{i in D'} w_i g_i = (1 / sum_{j in D'} s_j) (sum_{i in D'} g_i g_i^T) g_val,
a positive semi-definite matrix times g_val: a preconditioned step down the validation SFT loss
(influence.py's docstring). The controls: SFT on the validation solutions (--algo sft
--sft-data val), PPO plus an SFT term on them (--sft-coef), and I-PPO's advantages re-whitened
over the kept set (--rewhiten-kept)."""
import json
from pathlib import Path

import pytest
import torch

import draws
import optim
import train
from config import Config
from influence import episode_gradients, sft_nll, validation_gradient
from model import lora_parameters
from rollout import encode_pairs
from test_influence import TEMPERATURE, make_buffer
from test_train import SMALL, metrics, run


pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py


def first_step_gradient(policy, cfg, buf, val_seqs=None) -> torch.Tensor:
    """The LoRA gradient of ppo_update's first optimizer step, as the optimizer sees it."""
    optimizer = optim.make_optimizer(cfg, policy)
    seen = []

    def step():
        if not seen:
            seen.append(torch.cat([p.grad.reshape(-1).clone() for p in lora_parameters(policy)]))
    optimizer.step = step
    train.ppo_update(0, cfg, policy, optimizer, buf, train.passes_for(0, cfg), sft_seqs=val_seqs)
    return seen[0].double()


def validation_set(tok):
    return encode_pairs(tok, ["Q: 2+2?", "Q: 10-3?", "Q: 9+1?"], ["#### 4", "10 - 3 = 7\n#### 7", "9 + 1 = 10.\n#### 10"])


def test_the_ippo_update_is_a_preconditioned_step_down_the_validation_loss(tiny_dir):
    policy, tok, rollouts, advantages = make_buffer(tiny_dir)
    val = validation_set(tok)
    cfg = Config(influence="on", temperature=TEMPERATURE, minibatch_size=6, micro_batch_size=4, ppo_epochs=1,
                 max_grad_norm=0.0, val_batch_size=2)
    buf = train.Buffer([], rollouts, advantages=advantages, returns=torch.zeros_like(advantages))
    buf.keep, buf.weights = train.select_episodes(0, cfg, policy, buf, val, train.passes_for(0, cfg))   # the real filter
    assert 0 < int(buf.keep.sum()) < len(rollouts)                                     # some dropped, some kept
    update = first_step_gradient(policy, cfg, buf)

    # the oracle: per-episode gradients and g_val by their definitions
    grads = episode_gradients(policy, rollouts, advantages, clip_eps=cfg.clip_eps, temperature=TEMPERATURE).double()
    g_val = validation_gradient(policy, val, temperature=TEMPERATURE).double()
    kept = grads[buf.keep]                                                             # (|D'|, P)
    scores = kept @ g_val
    expected = kept.T @ (kept @ g_val) / scores.sum()                                  # G+ g_val / sum s
    torch.testing.assert_close(update, expected, rtol=1e-4, atol=1e-6 * expected.abs().max().item())
    # to first order the step lowers the validation loss: the update's gradient has g_val . update > 0
    assert float(update @ g_val) > 0


def test_without_the_filter_the_update_is_not_that_step(tiny_dir):
    """The check above can fail: PPO's first step (every episode, weight 1) is not G+ g_val / sum s."""
    policy, tok, rollouts, advantages = make_buffer(tiny_dir)
    val = validation_set(tok)
    cfg = Config(influence="off", temperature=TEMPERATURE, minibatch_size=6, micro_batch_size=4, ppo_epochs=1,
                 max_grad_norm=0.0)
    keep = torch.ones(len(rollouts), dtype=torch.bool)
    buf = train.Buffer([], rollouts, advantages=advantages, returns=torch.zeros_like(advantages), keep=keep,
                       weights=torch.ones(len(rollouts)))
    update = first_step_gradient(policy, cfg, buf)
    grads = episode_gradients(policy, rollouts, advantages, clip_eps=cfg.clip_eps, temperature=TEMPERATURE).double()
    g_val = validation_gradient(policy, val, temperature=TEMPERATURE).double()
    torch.testing.assert_close(update, grads.mean(0), rtol=1e-4, atol=1e-7)
    preconditioned = grads.T @ (grads @ g_val) / (grads @ g_val).sum()
    assert not torch.allclose(update, preconditioned, rtol=1e-2, atol=1e-6)


def test_the_sft_term_adds_coef_times_the_gradient_of_a_batch_of_validation_nll(tiny_dir):
    policy, tok, rollouts, advantages = make_buffer(tiny_dir)
    val = validation_set(tok)
    keep = torch.ones(len(rollouts), dtype=torch.bool)
    buf = train.Buffer([], rollouts, advantages=advantages, returns=torch.zeros_like(advantages), keep=keep,
                       weights=torch.ones(len(rollouts)))
    base = dict(influence="off", temperature=TEMPERATURE, minibatch_size=6, micro_batch_size=4, ppo_epochs=1,
                max_grad_norm=0.0, sft_batch_size=2)
    plain = first_step_gradient(policy, Config(**base), buf)
    mixed = first_step_gradient(policy, Config(**base, sft_coef=0.5), buf, val)
    rows = draws.batch_indices(len(val), 0, 2, 0, purpose=draws.SFT_ROWS)              # step 0 of the run
    nll, n = sft_nll(policy, val.select(rows))
    params = lora_parameters(policy)
    sft_grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(nll.sum() / n.sum(), params)]).double()
    assert sft_grad.norm() > 0
    torch.testing.assert_close(mixed - plain, 0.5 * sft_grad, rtol=1e-4, atol=1e-7)


def test_rewhitening_gives_the_kept_set_a_weighted_mean_advantage_of_zero(tiny_dir):
    _, _, rollouts, advantages = make_buffer(tiny_dir)
    mask = rollouts.response_mask
    keep = torch.tensor([True, False, True, True, False, True])
    weights = torch.tensor([2.0, 0.0, 0.5, 1.0, 0.0, 0.5])
    from ppo import whiten
    out = whiten(advantages, mask, weights=weights * keep)
    token_w = (weights * keep)[:, None] * mask
    mean = (out * token_w).sum() / token_w.sum()
    var = (token_w * (out - mean) ** 2).sum() / token_w.sum()
    assert abs(mean.item()) < 1e-6 and var.item() == pytest.approx(1.0, abs=1e-5)
    assert (out[~mask.bool()] == 0).all()
    # before, the kept set's weighted mean was not 0: the check can fail
    assert abs(((advantages * token_w).sum() / token_w.sum()).item()) > 1e-3


def test_sft_on_the_validation_rows_trains_on_them_only(tiny_dir, tmp_path, monkeypatch):
    seen = []
    real = train.sft_iteration
    monkeypatch.setattr(train, "sft_iteration", lambda it, cfg, policy, tok, opt, examples, *a, **k:
                        seen.append([e.where for e in examples]) or real(it, cfg, policy, tok, opt, examples, *a, **k))
    run_dir = run(tiny_dir, tmp_path / "sft", "--algo", "sft", "--sft-data", "val", "--iterations", "2",
                  "--eval-every", "0", "--sft-batch-size", "2", "--lr", "1e-2")
    val_rows = json.loads((Path(run_dir) / "data.json").read_text())["val_rows"]
    assert len(val_rows) == 4 and all(rows == val_rows for rows in seen)
    assert len(metrics(run_dir)) == 2


def test_ppo_with_an_sft_term_and_ippo_rewhitened_run_and_log(tiny_dir, tmp_path):
    ptx = run(tiny_dir, tmp_path / "ptx", "--iterations", "1", "--eval-every", "0", "--influence", "off",
              "--sft-coef", "0.5", "--sft-batch-size", "2", "--max-grad-norm", "0")
    row = metrics(ptx)[0]
    assert row["sft_loss"] > 0 and row["grad_norm_first"] > 0
    rew = run(tiny_dir, tmp_path / "rew", "--iterations", "1", "--eval-every", "0", "--rewhiten-kept")
    assert "score_mean" in metrics(rew)[0]


@pytest.mark.parametrize("flags,message", [
    (["--algo", "sft", "--sft-coef", "1"], "--sft-coef"),
    (["--influence", "off", "--rewhiten-kept"], "--rewhiten-kept"),
    (["--sft-data", "val"], "--sft-data"),
    (["--influence", "off", "--sft-coef", "1", "--eval-split", "val"], "--eval-split"),
    (["--max-grad-norm", "-1"], "--max-grad-norm"),
])
def test_the_controls_refuse_what_makes_no_sense(tiny_dir, tmp_path, flags, message):
    with pytest.raises(SystemExit, match=message):
        train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "x"), *SMALL, *flags])
