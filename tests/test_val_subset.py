"""--val-subset K: g_val over a fresh random K of the validation solutions each iteration (not
exact, cheaper), checked against the definition on those K rows."""
import pytest
import torch

import draws
import train
from config import Config, check_against_ranks, parse_config
from influence import episode_gradients, validation_gradient
from rollout import encode_pairs
from test_influence import TEMPERATURE, make_buffer

pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py


def test_the_rows_are_k_distinct_solutions_drawn_afresh_each_iteration_and_again_on_resume():
    rows = [draws.validation_rows(seed=3, it=it, k=5, n=12) for it in range(4)]
    for r in rows:
        assert len(set(r.tolist())) == 5 and 0 <= int(r.min()) and int(r.max()) < 12
        assert r.tolist() == sorted(r.tolist())
    assert len({tuple(r.tolist()) for r in rows}) > 1                       # not the same rows every iteration
    assert torch.equal(rows[2], draws.validation_rows(seed=3, it=2, k=5, n=12))   # a resumed run draws the same
    assert not torch.equal(rows[2], draws.validation_rows(seed=4, it=2, k=5, n=12))
    assert draws.validation_rows(seed=0, it=0, k=12, n=12).tolist() == list(range(12))


@pytest.mark.parametrize("k", [0, 2, 3])
def test_the_scores_use_g_val_of_the_drawn_rows_only(tiny_dir, k):
    policy, tok, rollouts, advantages = make_buffer(tiny_dir)
    val = encode_pairs(tok, ["Q: 2+2?", "Q: 10-3?", "Q: 9+1?"], ["#### 4", "10 - 3 = 7\n#### 7", "9 + 1 = 10.\n#### 10"])
    cfg = Config(influence="on", temperature=TEMPERATURE, val_size=3, val_subset=k, val_batch_size=2, seed=1)
    scores, g_val = train.validation_scores(5, cfg, policy, rollouts, advantages, val, train.passes_for(5, cfg))
    rows = draws.validation_rows(1, 5, k, 3) if k else torch.arange(3)
    expected = validation_gradient(policy, val.select(rows), temperature=TEMPERATURE)      # the mean over those rows' tokens
    assert (g_val - expected).norm() < 1e-5 * expected.norm()                            # float rounding apart
    grads = episode_gradients(policy, rollouts, advantages, clip_eps=cfg.clip_eps, temperature=TEMPERATURE)
    oracle = grads.double() @ expected.double()
    assert (scores.double() - oracle).abs().max() < 1e-4 * oracle.abs().max()
    if k == 2:   # two of the three: not the whole set's g_val
        whole = validation_gradient(policy, val, temperature=TEMPERATURE)
        assert (g_val - whole).norm() > 1e-2 * whole.norm()


@pytest.mark.parametrize("argv, named", [
    (["--val-size", "8", "--val-subset", "9"], "--val-subset"),
    (["--val-subset", "-1"], "--val-subset"),
    (["--influence", "off", "--val-subset", "4"], "--influence off"),
    (["--score-against", "batch", "--val-subset", "4"], "--score-against batch"),
])
def test_a_subset_that_makes_no_sense_is_refused(argv, named):
    with pytest.raises(SystemExit, match=named):
        parse_config(argv)


def test_a_subset_is_refused_under_torchrun():
    with pytest.raises(SystemExit, match="--val-subset: not implemented under torchrun"):
        check_against_ranks(parse_config(["--val-subset", "16"]), ranks=2)
    check_against_ranks(parse_config(["--val-subset", "16"]), ranks=1)
