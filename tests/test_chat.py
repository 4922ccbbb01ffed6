"""The path of a chat-tuned model (google/gemma-3-1b-it), on a tiny Gemma-3 whose tokenizer has
Gemma's chat template (conftest.chat_dir): prompts go through the template, <end_of_turn> ends
a response and carries the reward, SFT targets and validation solutions end with it,
evaluation stops there, and no decoded response holds a template token."""
import json

import pytest
import torch

import train
from accuracy import generate_responses
from model import eos_token_ids, load_policy
from ppo import kl_penalized_rewards
from rollout import encode_pairs, encode_prompts, generate_rollouts, old_and_ref_logprobs, token_logprobs
from test_train import SMALL
from transformers import GenerationConfig

pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py: one intra-op thread

TEMPLATE_TOKENS = ("<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>")
QUESTION, SOLUTION = "Question: 2+2?\nAnswer:", "#### 4"


@pytest.fixture(scope="module")
def taught(chat_dir):
    """The tiny chat model taught (all weights, a few dozen steps) to answer QUESTION with
    SOLUTION and then end its turn, through the same encode_pairs that SFT uses."""
    policy, tok = load_policy(chat_dir, quiet=True)
    seqs = encode_pairs(tok, [QUESTION], [SOLUTION])
    params = [p for p in policy.lm.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(60):
        opt.zero_grad()
        logprobs, _, _ = token_logprobs(policy, seqs)   # the plain path: the lean one needs a frozen LM head
        (-(logprobs * seqs.response_mask).sum() / seqs.response_mask.sum()).backward()
        opt.step()
    for p in params:
        p.requires_grad_(False)
    return policy, tok


def test_prompts_go_through_the_template_and_targets_end_with_end_of_turn(chat_dir):
    _, tok = load_policy(chat_dir, quiet=True)
    eot = tok.convert_tokens_to_ids("<end_of_turn>")
    assert eos_token_ids(tok) == [tok.eos_token_id, eot]
    ids, mask = encode_prompts(tok, [QUESTION, "Q: 7?"])
    row = ids[0][mask[0].bool()]
    assert tok.decode(row) == f"<bos><start_of_turn>user\n{QUESTION.strip()}<end_of_turn>\n<start_of_turn>model\n"
    assert (row == tok.bos_token_id).sum() == 1            # one BOS: the template's, none added on top
    assert (row == tok.convert_tokens_to_ids("<start_of_turn>")).sum() == 2   # one id per turn token
    # SFT targets and the validation solutions (both encode_pairs) end with <end_of_turn>.
    seqs = encode_pairs(tok, [QUESTION, "Q: 7?"], [SOLUTION, "7 = 7\n#### 7"])
    for i in range(2):
        response = seqs.response_ids[i][seqs.response_mask[i].bool()]
        assert response[-1] == eot and (response[:-1] != eot).all()
        assert tok.decode(response[:-1]) == [SOLUTION, "7 = 7\n#### 7"][i]


def test_end_of_turn_ends_a_response_and_carries_the_reward(taught):
    policy, tok = taught
    eot = tok.convert_tokens_to_ids("<end_of_turn>")
    rollouts = generate_rollouts(policy, tok, [QUESTION], n_samples=4, max_new_tokens=12, temperature=0.5,
                                 seed=0, progress=False)
    rollouts.old_logprobs, rollouts.values, rollouts.ref_logprobs = old_and_ref_logprobs(policy, rollouts, 0.5, 16)
    lengths = rollouts.response_mask.sum(-1).long()
    ended = 0
    for i in range(len(rollouts)):
        response = rollouts.response_ids[i][:lengths[i]]
        if not rollouts.truncated[i]:
            ended += 1
            assert response[-1] in eos_token_ids(tok) and not torch.isin(response[:-1], torch.tensor(eos_token_ids(tok))).any()
        assert (rollouts.response_mask[i, lengths[i]:] == 0).all()                 # nothing after it counts
        assert not any(t in rollouts.responses[i] for t in TEMPLATE_TOKENS)
    assert ended >= 3 and sum(rollouts.response_ids[i, lengths[i] - 1] == eot for i in range(4)) >= 3
    assert rollouts.responses.count(SOLUTION) >= 3
    # The task score sits at the last response token: <end_of_turn> for the episodes that ended.
    scores = torch.arange(1.0, 5.0)
    rewards, _ = kl_penalized_rewards(scores, rollouts.old_logprobs, rollouts.ref_logprobs, rollouts.response_mask, 0.0)
    for i in range(4):
        assert rewards[i, lengths[i] - 1] == scores[i] and rewards[i].sum() == scores[i]


def test_greedy_evaluation_stops_at_end_of_turn(taught):
    policy, tok = taught
    greedy = GenerationConfig(do_sample=False, max_new_tokens=12, eos_token_id=eos_token_ids(tok),
                              pad_token_id=tok.pad_token_id)
    [(response, truncated)] = generate_responses(policy, tok, [QUESTION], greedy, batch_size=1, progress=False,
                                                 desc="eval")
    assert (response, truncated) == (SOLUTION, False)


def test_sft_then_i_ppo_run_on_a_chat_model(chat_dir, tmp_path):
    sft = train.main(["--model", chat_dir, "--run-dir", str(tmp_path / "sft"), *SMALL, "--algo", "sft",
                      "--iterations", "1", "--eval-every", "0"])
    ippo = train.main(["--model", chat_dir, "--run-dir", str(tmp_path / "ippo"), *SMALL, "--init-adapter", str(sft),
                       "--iterations", "1", "--eval-every", "1", "--temperature", "1.5"])
    episodes = [json.loads(l) for l in (ippo / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 6 and all("score" in e for e in episodes)
    for e in episodes:
        assert not any(t in e["response"] for t in TEMPLATE_TOKENS)
        assert "<start_of_turn>" not in e["prompt"]   # the record holds the question's prompt, not the template
