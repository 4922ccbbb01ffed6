"""Classic wrong answers to each exercise, planted to show that the grader catches them.

MISTAKES[exercise] lists (what the mistake is, words the grader's message must contain, the
wrong function's source). tests/test_exercises.py grades each one and checks that it fails
with that message; an instructor can show them to a class as what not to write.
"""

WRONG = {}   # filled below: exercise -> [(mistake, expected words, {function: source})]


def mistake(exercise: str, what: str, says: str, **sources: str) -> None:
    WRONG.setdefault(exercise, []).append((what, says, {name.replace("__", "."): src for name, src in sources.items()}))


mistake("kl_reward", "the KL penalty's sign flipped", "wrong sign", kl_penalized_rewards='''
def kl_penalized_rewards(task_rewards, logprobs, ref_logprobs, mask, beta):
    kl = (logprobs - ref_logprobs) * mask
    rewards = beta * kl
    last = (mask.sum(-1).long() - 1).clamp(min=0)
    rewards[torch.arange(len(task_rewards)), last] += task_rewards * (mask.sum(-1) > 0)
    return rewards, kl
''')
mistake("kl_reward", "the task reward on the padded tensor's last column", "last response token",
        kl_penalized_rewards='''
def kl_penalized_rewards(task_rewards, logprobs, ref_logprobs, mask, beta):
    kl = (logprobs - ref_logprobs) * mask
    rewards = -beta * kl
    rewards[:, -1] += task_rewards
    return rewards, kl
''')

mistake("gae", "bootstraps past the end of the response", "bootstraps past the end", gae='''
def gae(rewards, values, mask, gamma, lam):
    N, T = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_advantage, next_value = torch.zeros(N), torch.zeros(N)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = (delta + gamma * lam * next_advantage) * mask[:, t]
        advantages[:, t] = next_advantage
        next_value = values[:, t]                     # the padding's value too
    return advantages, (advantages + values) * mask
''')
mistake("gae", "ignores the mask", "ignores the mask", gae='''
def gae(rewards, values, mask, gamma, lam):
    N, T = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_advantage, next_value = torch.zeros(N), torch.zeros(N)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    return advantages, advantages + values
''')

mistake("whiten", "whitening over padding", "over padding", whiten='''
def whiten(x, mask, eps=1e-8, reduce_sum=None, std_floor=0.0, weights=None):
    mean, var = x.mean(), x.var(unbiased=False)          # every position, padding included
    return (x - mean) / torch.sqrt(var + eps).clamp(min=std_floor) * mask
''', batch_mean_var='''
def batch_mean_var(x, mask, reduce_sum=None):
    return x.mean(), x.var(unbiased=False)
''')

mistake("policy_loss", "the clip applied on the wrong side for negative advantages", "wrong side", policy_loss='''
def policy_loss(logprobs, old_logprobs, advantages, mask, clip_eps):
    ratio = torch.exp(logprobs - old_logprobs)
    return masked_mean(-advantages * torch.clamp(ratio, max=1.0 + clip_eps), mask)
''')
mistake("policy_loss", "a mean over the wrong axis", "wrong axis", policy_loss='''
def policy_loss(logprobs, old_logprobs, advantages, mask, clip_eps):
    ratio = torch.exp(logprobs - old_logprobs)
    loss = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps))
    return (loss * mask).sum(0) / mask.sum(0).clamp(min=1.0)          # over episodes, per token
''')

mistake("value_loss", "the smaller of the two errors", "the larger (pessimistic)", value_loss='''
def value_loss(values, old_values, returns, mask, clip_eps):
    if clip_eps == 0:
        return masked_mean(0.5 * (values - returns) ** 2, mask)
    clipped = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
    return masked_mean(0.5 * torch.minimum((values - returns) ** 2, (clipped - returns) ** 2), mask)
''')

mistake("grpo", "statistics over the whole batch, not each prompt's group", "not from the whole batch",
        group_advantages='''
def group_advantages(rewards, groups, eps=1e-6):
    return (rewards - rewards.mean()) / (rewards.std(unbiased=False) + eps)
''')
mistake("grpo", "the unbiased (n - 1) standard deviation", "population std", group_advantages='''
def group_advantages(rewards, groups, eps=1e-6):
    advantages = torch.zeros_like(rewards)
    for g in groups.unique():
        members = groups == g
        r = rewards[members]
        std = r.std() if len(r) > 1 else torch.tensor(0.0)
        advantages[members] = (r - r.mean()) / (std + eps)
    return advantages
''')

mistake("lora", "the update not scaled by alpha / rank", "scaled by alpha / rank", LoRALinear__forward='''
def forward(self, x):
    y = self.base(x)
    A, B = (self.lora_A, self.lora_B) if self.enabled else (self.ref_A, self.ref_B)
    if A is None:
        return y
    return y + ((x.to(A.dtype) @ A.T) @ B.T).to(y.dtype)
''')
mistake("lora", "the adapters used even when disabled", "adapters disabled", LoRALinear__forward='''
def forward(self, x):
    return self.base(x) + (self.scale * (x.to(self.lora_A.dtype) @ self.lora_A.T) @ self.lora_B.T).to(x.dtype)
''')

mistake("episode_gradients", "every row the gradient of the whole batch's loss", "whole batch", episode_gradients='''
def episode_gradients(policy, rollouts, advantages, *, clip_eps, temperature, progress=False):
    params = lora_parameters(policy)
    logprobs, _, _ = token_logprobs(policy, rollouts, temperature)
    loss = policy_loss(logprobs, rollouts.old_logprobs, advantages, rollouts.response_mask, clip_eps).mean()
    g = flat_gradient(torch.autograd.grad(loss, params, allow_unused=True), params)
    return g.expand(len(rollouts), -1).clone()
''', group_gradients='''
def group_gradients(policy, rollouts, advantages, *, clip_eps, temperature):
    raise NotImplementedError
''')
mistake("episode_gradients", "the gradient of the objective, not the loss (ascent against descent)", "sign flipped",
        episode_gradients='''
def episode_gradients(policy, rollouts, advantages, *, clip_eps, temperature, progress=False):
    params = lora_parameters(policy)
    rows = []
    for i in range(len(rollouts)):
        episode = rollouts.select([i])
        logprobs, _, _ = token_logprobs(policy, episode, temperature)
        objective = -policy_loss(logprobs, episode.old_logprobs, advantages[i:i + 1], episode.response_mask, clip_eps)[0]
        rows.append(flat_gradient(torch.autograd.grad(objective, params, allow_unused=True), params))
    return torch.stack(rows)
''', group_gradients='''
def group_gradients(policy, rollouts, advantages, *, clip_eps, temperature):
    raise NotImplementedError
''')

mistake("influence_scores", "the score's sign flipped", "sign is flipped", influence_scores='''
def influence_scores(episode_grads, g_val):
    return -(episode_grads.double() @ g_val.double()).float()
''')
mistake("influence_scores", "a cosine instead of the dot product", "cosine", influence_scores='''
def influence_scores(episode_grads, g_val):
    g, v = episode_grads.double(), g_val.double()
    return ((g @ v) / (g.norm(dim=1) * v.norm())).float()
''')

mistake("filter", "weights that do not average to 1 over the kept episodes", "average to 1", filter_and_reweight='''
def filter_and_reweight(scores):
    keep = scores > 0
    weights = torch.where(keep, scores / scores.mean(), torch.zeros_like(scores))
    return keep, weights
''')
mistake("filter", "episodes with a zero score kept", "s_i > 0, not s_i >= 0", filter_and_reweight='''
def filter_and_reweight(scores):
    keep = scores >= 0
    weights = torch.zeros_like(scores)
    if keep.any():
        weights[keep] = scores[keep] / scores[keep].mean()
    return keep, weights
''')
