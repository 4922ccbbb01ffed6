"""Live curves: every metric of a run as TensorBoard event files in run_dir/tensorboard/, read
back here with tensorboard's own reader (CI installs tensorboard, so this runs there)."""
import pytest

from test_train import run

pytest.importorskip("tensorboard")
pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py


def scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_every_metric_is_in_the_event_files_and_a_resumed_run_logs_each_step_once(tiny_dir, tmp_path):
    import train
    from test_train import metrics
    run_dir = run(tiny_dir, tmp_path / "r", "--iterations", "2", "--eval-every", "2")
    seen = scalars(run_dir)
    rows = metrics(run_dir)
    assert [step for step, _ in seen["reward"]] == [1, 2]
    assert seen["reward"][1][1] == pytest.approx(rows[2]["reward"])
    assert [step for step, _ in seen["eval_accuracy"]] == [0, 2] and "seconds/update" in seen and "kept_fraction" in seen
    train.main(["--resume", str(run_dir), "--iterations", "3", "--no-progress"])
    assert [step for step, _ in scalars(run_dir)["reward"]] == [1, 2, 3]


def test_no_event_files_with_no_tensorboard(tiny_dir, tmp_path):
    run_dir = run(tiny_dir, tmp_path / "r", "--iterations", "1", "--eval-every", "0", "--no-tensorboard")
    assert not (run_dir / "tensorboard").exists()
