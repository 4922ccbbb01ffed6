"""Nothing trusted: no model code runs unless --trust-remote-code is given, no file is
unpickled, no text is evaluated. The source checks parse every project .py file with `ast`,
so `model.eval()` (a method) and the string "eval(" in a test are told apart from a call of
the builtin."""
import ast
from pathlib import Path

import pytest
import transformers

import model
import rundir
import train

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_BUILTINS = {"eval", "exec", "compile", "__import__"}
FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}


def project_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py")
                  if not any(part.startswith(".") or part in ("runs", "__pycache__") for part in p.relative_to(ROOT).parts))


def is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def violations(source: str, where: str) -> list[str]:
    """Every call of eval/exec/compile/__import__ (as a name or builtins.X), import of a
    pickle-like module, torch.load without weights_only=True, and trust_remote_code=True,
    allow_pickle=True or yaml.load written into the code."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{line}: import {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
            found.append(f"{line}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in FORBIDDEN_BUILTINS:
                found.append(f"{line}: {f.id}(...)")
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                if f.value.id == "builtins" and f.attr in FORBIDDEN_BUILTINS:
                    found.append(f"{line}: builtins.{f.attr}(...)")
                if f.value.id == "torch" and f.attr == "load" and not any(
                        k.arg == "weights_only" and is_true(k.value) for k in node.keywords):
                    found.append(f"{line}: torch.load without weights_only=True")
                if f.value.id == "yaml" and f.attr == "load":
                    found.append(f"{line}: yaml.load (use yaml.safe_load)")
            found += [f"{line}: {k.arg}=True" for k in node.keywords
                      if k.arg in ("trust_remote_code", "allow_pickle") and is_true(k.value)]
    return found


def test_the_source_check_tells_calls_of_builtins_from_methods():
    bad = ("import pickle\nfrom marshal import loads\nimport builtins, torch, yaml\n"
           "eval('1')\nexec('x = 1')\ncompile('1', 'f', 'eval')\n__import__('os')\nbuiltins.eval('2')\n"
           "torch.load('f.pt')\ntorch.load('f.pt', weights_only=False)\nyaml.load(s)\n"
           "AutoModel.from_pretrained('x', trust_remote_code=True)\nnp.load('a.npy', allow_pickle=True)\n")
    flagged_lines = [int(v.split(":")[1]) for v in violations(bad, "bad.py")]
    assert sorted(flagged_lines) == [1, 2] + list(range(4, 14))   # every line but the plain imports
    good = ("import torch, re\nmodel.eval()\npolicy.lm.eval()\nre.compile('a+')\ns = 'eval(x)'\n"
            "torch.load('f.pt', weights_only=True)\nAutoModel.from_pretrained('x', trust_remote_code=flag)\n")
    assert violations(good, "good.py") == []


def test_no_eval_exec_or_pickle_anywhere_in_the_project():
    files = project_files()
    assert ROOT / "train.py" in files and ROOT / "tests" / "test_security.py" in files
    found = [v for path in files for v in violations(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


@pytest.fixture
def from_pretrained_calls(monkeypatch):
    """Record the keyword arguments of every from_pretrained of the Auto classes (then load)."""
    calls = []
    for cls in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        def recording(*args, _original=cls.from_pretrained, _name=cls.__name__, **kwargs):
            calls.append((_name, kwargs))
            return _original(*args, **kwargs)
        monkeypatch.setattr(cls, "from_pretrained", recording)
    return calls


@pytest.mark.parametrize("asked", [None, True])
def test_load_policy_trusts_remote_code_only_when_asked(tiny_dir, from_pretrained_calls, asked):
    """By default every from_pretrained gets trust_remote_code=False, explicitly."""
    kwargs = {} if asked is None else {"trust_remote_code": asked}
    model.inspect_model(tiny_dir, **kwargs)
    model.load_policy(tiny_dir, quiet=True, **kwargs)
    assert {name for name, _ in from_pretrained_calls} == {"AutoConfig", "AutoTokenizer", "AutoModelForCausalLM"}
    assert all(call["trust_remote_code"] is bool(asked) for _, call in from_pretrained_calls)


class Stop(Exception):
    pass


@pytest.mark.parametrize("flags, trusted", [([], False), (["--trust-remote-code"], True)])
def test_train_trusts_remote_code_only_with_the_flag(tiny_dir, tmp_path, monkeypatch, flags, trusted):
    seen = {}
    real_inspect = train.inspect_model

    def inspect(source, trust_remote_code, **kwargs):
        seen["inspect_model"] = trust_remote_code
        return real_inspect(source, trust_remote_code, **kwargs)

    def load(source, **kwargs):
        seen["load_policy"] = kwargs["trust_remote_code"]
        raise Stop

    monkeypatch.setattr(train, "inspect_model", inspect)
    monkeypatch.setattr(train, "load_policy", load)
    with pytest.raises(Stop):
        train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "r"), "--data-source", "local", *flags])
    assert seen == {"inspect_model": trusted, "load_policy": trusted}


def test_checkpoints_hold_only_safetensors_and_json(tiny_dir, tmp_path):
    from safetensors import safe_open
    run_dir = train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "r"), "--iterations", "1",
                          "--prompts-per-iter", "1", "--samples-per-prompt", "2", "--max-new-tokens", "4",
                          "--val-size", "2", "--eval-every", "0", "--truncation-penalty", "1", "--no-progress",
                          "--data-source", "local"])
    ckpt = rundir.latest_checkpoint(run_dir)
    assert {p.suffix for p in ckpt.iterdir()} == {".safetensors", ".json"}
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([*rundir.CHECKPOINT_FILES, rundir.CHECKSUMS])
    for p in ckpt.glob("*.safetensors"):
        with safe_open(p, framework="pt") as f:
            assert list(f.keys()) is not None
