"""No pass whose result is unused: skipping one changes nothing but the time."""
import json

import rollout
import train
from test_train import SMALL, comparable, metrics, one_thread  # noqa: F401  (one_thread: autouse fixture)


def test_no_reference_pass_at_kl_beta_0_and_nothing_else_changes(tiny_dir, tmp_path, monkeypatch):
    calls = []
    real = rollout._score_tokens

    def counting(policy, seqs, temperature, batch_size, reference=True):
        calls.append(reference)
        return real(policy, seqs, temperature, batch_size, reference)

    monkeypatch.setattr(rollout, "_score_tokens", counting)
    args = ["--model", tiny_dir, *SMALL, "--iterations", "2", "--eval-every", "0", "--kl-beta", "0", "--lr", "1e-2"]
    skipped = train.main([*args, "--run-dir", str(tmp_path / "skipped")])
    assert calls == [False, False]
    # The same run with the reference pass forced back in: identical but for the logged KL.
    monkeypatch.setattr(rollout, "_score_tokens", lambda p, s, t, b, reference=True: real(p, s, t, b, True))
    full = train.main([*args, "--run-dir", str(tmp_path / "full")])
    a, b = metrics(skipped), metrics(full)
    assert all("kl" not in m for m in a) and all("kl" in m for m in b[1:])
    assert [comparable(m) for m in a] == [{k: v for k, v in comparable(m).items() if k != "kl"} for m in b]
    episodes = lambda d: (d / "episodes.jsonl").read_text()   # noqa: E731
    assert episodes(skipped) == episodes(full)
    assert json.loads((skipped / "config.json").read_text())["kl_beta"] == 0
