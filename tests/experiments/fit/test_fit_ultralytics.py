"""The complete-fit tier on the real Ultralytics trainer, on the CPU with a tiny synthetic set.

It runs offline, with polars made unimportable as on the H200 image. The arm's optimizer is substituted, every
upstream loop element runs, and nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.fit.dataset import SyntheticSet, describe_user_set, ensure_synthetic_set
from experiments.fit.stages import STAGES, stage_column
from experiments.fit.ultralytics_fit import offline_environment, read_results_csv
from harness.cli import main
from tests.argv import ONE_PAIR, overridden
from tests.runfolders import only_run

HAS_ULTRALYTICS = (
    importlib.util.find_spec("ultralytics") is not None
    and importlib.util.find_spec("torchvision") is not None
)
NO_EXTRA = "needs the ultralytics extra (pip install -e '.[ultralytics]')"
TINY = [
    *("--workload", "ultralytics", "--images", "8", "--val-images", "8", "--imgsz", "64"),
    *("--batch", "4", "--steps", "2", *ONE_PAIR, "--quiet"),
]
BLOCKED = (
    "polars",
    "thop",
    "ultralytics_platform",
)  # absent on the H200 unless carried: prove none is needed


@pytest.fixture
def without_optional_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Workers see stand-ins for polars, thop and ultralytics_platform that refuse to import."""
    blocked = tmp_path.parent / f"{tmp_path.name}-blocked"
    for name in BLOCKED:
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is blocked by the test')\n")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in (str(blocked), os.environ.get("PYTHONPATH")) if p)
    )
    return blocked


@pytest.fixture(scope="module")
def narrow_yolo26(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """`--model` for the fits here: the installed YOLO26 yaml with only its n scale, at half of n's width.

    On the CPU nearly all of a tiny fit is bf16 Newton-Schulz over yolo26n's matrices: 4-9 s a step on two
    busy cores. At half the width every layer, parameter group and loop element is still there. The matrices
    are an eighth of the work. What the fits here prove does not depend on the width.
    """
    import ultralytics

    source = Path(ultralytics.__file__).parent / "cfg" / "models" / "26" / "yolo26.yaml"
    lines = source.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("scales:"))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    scale_n = next(line for line in lines[start:end] if line.strip().startswith("n:"))
    assert scale_n.split("#")[0].split() == ["n:", "[0.50,", "0.25,", "1024]"], scale_n  # upstream's n scale
    narrow = [*lines[:start], "scales:", "  n: [0.50, 0.125, 1024]", *lines[end:]]
    path = tmp_path_factory.mktemp("models") / "yolo26n-narrow.yaml"  # the stem names scale n
    path.write_text("\n".join(narrow) + "\n")
    return ["--model", str(path)]


def test_synthetic_set_is_deterministic_and_keyed(tmp_path: Path) -> None:
    spec = SyntheticSet(train_images=4, val_images=2, imgsz=64, seed=3)
    first = ensure_synthetic_set(spec, tmp_path / "a")
    second = ensure_synthetic_set(spec, tmp_path / "b")
    files = sorted(
        p.relative_to(first.parent) for p in first.parent.rglob("*") if p.is_file() and p.name != "data.yaml"
    )
    assert len(files) == 12  # 6 images and 6 label files
    for name in files:
        assert (first.parent / name).read_bytes() == (second.parent / name).read_bytes()
    assert first.parent.name == "synthetic-t4-v2-64px-seed3"
    assert describe_user_set(first) == (4, 2)
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.endswith(".tmp")]  # no staging folder left
    labels = (first.parent / "labels" / "train" / "train_00000.txt").read_text().split()
    assert 0 <= int(labels[0]) < 80 and all(0 < float(v) <= 1 for v in labels[1:5])


def test_results_csv_is_read_without_polars(tmp_path: Path) -> None:
    csv = tmp_path / "results.csv"
    csv.write_text("epoch,time, train/box_loss,metrics/mAP50(B)\n1,2.5,4.2,0\n2,5.0,3.9,0.125\n")
    assert read_results_csv(csv) == {
        "epoch": [1.0, 2.0],
        "time": [2.5, 5.0],
        "train/box_loss": [4.2, 3.9],
        "metrics/mAP50(B)": [0.0, 0.125],
    }
    assert read_results_csv(tmp_path / "missing.csv") == {}


@pytest.mark.ultralytics
@pytest.mark.skipif(not HAS_ULTRALYTICS, reason=NO_EXTRA)
def test_offline_worker_environment_fails_downloads_at_once(tmp_path: Path) -> None:
    """What the AMP check would fetch (yolo26n.pt) fails fast with ConnectionError and writes nothing."""
    script = (
        "import time; t = time.perf_counter()\n"
        "from ultralytics.utils.downloads import attempt_download_asset\n"
        "try:\n    attempt_download_asset(r'%s')\nexcept ConnectionError:\n    print('refused', time.perf_counter() - t)\n"
    ) % (tmp_path / "yolo26n.pt")
    env = {**os.environ, **offline_environment(tmp_path / "config")}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert "refused" in result.stdout, result.stdout + result.stderr
    assert float(result.stdout.split()[-1]) < 30
    assert not (tmp_path / "yolo26n.pt").exists()


@pytest.mark.ultralytics
@pytest.mark.skipif(not HAS_ULTRALYTICS, reason=NO_EXTRA)
@pytest.mark.slow
def test_real_trainer_pair_end_to_end_on_cpu(
    tmp_path: Path, without_optional_packages: Path, narrow_yolo26: list[str], capsys
) -> None:
    two_epochs = overridden(TINY, ["--steps", "4"])
    assert main(["pair", *two_epochs, *narrow_yolo26, "--out", str(tmp_path)]) == 0
    assert "workload: ultralytics" in capsys.readouterr().out
    folder = only_run(tmp_path)
    rows = folder.rows()
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows), [r["message"] for r in rows]
    classes = {r["arm"]: r["optimizer_class"] for r in rows}
    assert classes == {
        "baseline": "optimizers.musgd.MuSGD",
        "candidate-cpu": "experiments.arms.BatchedMuSGDOnCPU",
    }
    for row in rows:
        assert row["iterations"] == 4 and row["value"] > 0
        # The steady-state figure: epoch 2's span, from its start to its last iteration's end, read at the
        # trainer's own callbacks; within the clock's resolution of the logged span.
        spans = row["epoch_train_s"]
        assert len(spans) == 2 and all(span > 0 for span in spans)
        assert row["steady_s"] == pytest.approx(spans[1], abs=1e-9) and row["steady_s"] < row["value"]
        assert row["checkpoint_bytes"] > 0  # upstream's last.pt and best.pt were written
        log = (folder.path / "trials" / f"{row['index']}.log").read_text()
        assert "Closing dataloader mosaic" in log  # upstream's mosaic closure ran
        assert "blocked by the test" not in log
        fit_dir = folder.path / "trials" / f"{row['index']:03d}" / "fit"
        assert (fit_dir / "results.csv").is_file() and not list(fit_dir.rglob("*.pt"))
    config = folder.path / "ultralytics-config" / "Ultralytics"
    assert (config / "Arial.ttf").is_file()
    claim = folder.file("claim.txt").read_text().splitlines()[1:]  # after the answer
    assert claim[0].startswith("On cpu: baseline ran") and claim[1].startswith("Baseline median")
    assert "the real Ultralytics trainer" in folder.file("report.md").read_text()


@pytest.mark.ultralytics
@pytest.mark.skipif(not HAS_ULTRALYTICS, reason=NO_EXTRA)
@pytest.mark.slow
def test_real_trainer_stage_marks_cover_the_fit(
    tmp_path: Path, without_optional_packages: Path, narrow_yolo26: list[str]
) -> None:
    arguments = ["pair", *TINY, *narrow_yolo26, "--stages", "--control", "--no-report"]
    assert main([*arguments, "--out", str(tmp_path)]) == 0
    rows = only_run(tmp_path).rows()
    assert all(r["status"] == "ok" for r in rows), [r["message"] for r in rows]
    for row in rows:
        stages = {s: row[stage_column(s)] for s in STAGES}
        assert all(v > 0 for v in stages.values()), stages  # every stage was reached, validation and EMA too
        assert abs(sum(stages.values()) - row["value"]) < 0.05 * row["value"]


@pytest.mark.ultralytics
@pytest.mark.skipif(not HAS_ULTRALYTICS, reason=NO_EXTRA)
def test_user_data_yaml_is_counted_and_checked(tmp_path: Path, capsys) -> None:
    data = ensure_synthetic_set(
        SyntheticSet(train_images=8, val_images=2, imgsz=64, seed=0), tmp_path / "sets"
    )
    out = tmp_path / "runs"
    base = ["pair", "--workload", "ultralytics", "--data", str(data), "--imgsz", "64", "--out", str(out)]
    assert main([*base, "--steps", "3"]) == 2
    assert (
        "--steps 3 is not a whole number of epochs of 2 iterations (8 images / batch 4)"
        in capsys.readouterr().err
    )
    assert main([*base, "--images", "16"]) == 2
    assert "--images 16 disagrees with --data, which has 8 training images" in capsys.readouterr().err
    assert main([*base[:4], str(tmp_path / "missing.yaml"), "--out", str(out)]) == 2
    assert "cannot read it as YAML" in capsys.readouterr().err
    assert main([*base, "--model", "yolo26n.pt"]) == 2
    assert "is not a model yaml" in capsys.readouterr().err
    assert main(overridden(base, ["--imgsz", "100"])) == 2
    assert "--imgsz 100 is not a multiple of the YOLO stride 32" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.cuda
@pytest.mark.ultralytics
@pytest.mark.skipif(not HAS_ULTRALYTICS, reason=NO_EXTRA)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_trainer_on_cuda_fp16_skips_the_amp_check_offline(
    tmp_path: Path, without_optional_packages: Path
) -> None:
    """fp16 runs upstream's AMP check, which wants yolo26n.pt: offline it must be skipped (not hang), AMP kept."""
    assert (
        main(["pair", *TINY, "--device", "cuda", "--amp", "fp16", "--no-report", "--out", str(tmp_path)]) == 0
    )
    folder = only_run(tmp_path)
    rows = folder.rows()
    assert all(r["status"] == "ok" for r in rows), [r["message"] for r in rows]
    for row in rows:
        assert (
            row["amp_used"] is True
            and row["peak_allocated"] > 0
            and row["peak_reserved"] >= row["peak_allocated"]
        )
        assert "checks skipped" in (folder.path / "trials" / f"{row['index']}.log").read_text()


@pytest.mark.ultralytics
@pytest.mark.skipif(not HAS_ULTRALYTICS, reason=NO_EXTRA)
@pytest.mark.parametrize("cache", ["ram", "disk"])
def test_the_data_sets_side_effects_are_made_once_before_the_first_trial(tmp_path: Path, cache: str) -> None:
    """Ultralytics writes label caches into the data set the first time it builds it; with --cache disk, an
    .npy per image.

    The plan's trial function makes them, untimed, before any trial runs. So the first timed fit starts from
    the state every other does.
    """
    from experiments.fit.plan import FitSettings, make_plan
    from experiments.fit.trial import trial_function
    from harness.options import protocol_options

    spec = SyntheticSet(8, 4, 64, 0)
    root = tmp_path / "datasets"
    data = ensure_synthetic_set(spec, root).parent
    protocol = protocol_options(arms="baseline,candidate", device="cpu", warmup=0, pairs=1)
    settings = FitSettings(
        workload="ultralytics", data=str(data / "data.yaml"), batch=4, steps=2, imgsz=64, cache=cache
    )
    plan = make_plan(protocol, settings)
    assert not list(data.rglob("*.cache")) and not list(data.rglob("*.npy"))
    trial_function(plan)  # what the runner builds before the first trial
    assert sorted(p.relative_to(data).as_posix() for p in data.rglob("*.cache")) == [
        "labels/train.cache",
        "labels/val.cache",
    ]
    npy = list(data.rglob("*.npy"))
    assert len(npy) == (12 if cache == "disk" else 0)  # an image cache in RAM lives in each fit's own process
    assert "made once before the first trial, untimed" in plan.timed_region


@pytest.mark.ultralytics
@pytest.mark.skipif(not HAS_ULTRALYTICS, reason=NO_EXTRA)
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("backbone: [\n", "cannot read it as YAML"),
        ("- 1\n- 2\n", "'backbone' and 'head'"),
        ("nc: 80\n", "'backbone' and 'head'"),
    ],
)
def test_a_model_yaml_that_is_no_model_is_one_line(tmp_path: Path, capsys, text: str, says: str) -> None:
    """A --model file that is no model (not YAML, or no backbone and head) is refused before the run, in one
    line naming it.
    """
    model = tmp_path / "bad.yaml"
    model.write_text(text)
    out = tmp_path / "runs"
    assert main(["pair", "--workload", "ultralytics", "--model", str(model), "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and str(model) in error and says in error, error
    assert not out.exists()
