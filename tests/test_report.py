"""`hone report`: panels follow the logged keys, a guard rollback leaves the re-run values and a
marker, the PNGs are real images with one panel each (and all of them in report.png), the HTML
carries them inline, and bad input exits 2 naming the file and line."""

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from matplotlib.image import imread

from hone.cli import main
from hone.report import draw_grid, plan_panels, read_metrics, write_report

ROOT = Path(__file__).resolve().parents[1]
B64 = "data:image/png;base64,"


def write_rows(run_dir: Path, rows: list[dict], config: str | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if config is not None:
        (run_dir / "config.yaml").write_text(config)
    return run_dir


def guard(skipped=0, rollbacks=0, lr_scale=1.0, tripped=0) -> dict:
    return {"guard/skipped": skipped, "guard/rollbacks": rollbacks, "guard/lr_scale": lr_scale,
            "guard/tripped": tripped, "guard/loss_ema": 1.0}


def sft_rows(steps=20) -> list[dict]:
    rows = []
    for s in range(1, steps + 1):
        row = {"step": s, "loss": 3.0 / s, "lr": 1e-3 * (1 - s / steps), "grad_norm": 1.0 + s % 3,
               "tokens_per_s": 900.0 + 10 * s, "mfu": (900.0 + 10 * s) * 1e-4, "nll_sum": 7.0,
               **guard()}
        if s % 10 == 0:
            row["eval_loss"] = 3.2 / s
        rows.append(row)
    return rows


def rl_row(step, lr_scale=1.0, rollbacks=0, skipped=0, loss=None, tripped=0) -> dict:
    return {"step": step, "loss": 0.1 * step if loss is None else loss, "reward_mean": 0.05 * step,
            "eval_reward": 0.04 * step, "kl": 0.01 * step, "kl_sum": 3.0, "lr": 1e-4 * lr_scale,
            "tokens_per_s": 50.0, "grad_norm": 0.5, "events/reward_errors": 0,
            **guard(skipped, rollbacks, lr_scale, tripped)}


def rl_rows() -> list[dict]:
    """A run that skips a non-finite step at 3, spikes at 8, rolls back to 5 and re-runs 6-10."""
    rows = [rl_row(s, skipped=0 if s < 3 else 1) for s in range(1, 8)]
    rows.append(rl_row(8, skipped=1, loss=50.0, tripped=2))
    rows.append({"step": 8, "guard/rollback_to": 5, **guard(1, 1, 0.5, 2)})
    return rows + [rl_row(s, lr_scale=0.5, rollbacks=1, skipped=1) for s in range(6, 11)]


def check_png(path: Path, shape=None) -> None:
    img = imread(path)
    assert img.ndim == 3 and img.shape[0] >= 200 and img.shape[1] >= 300
    if shape is not None:
        assert img.shape[:2] == shape
    assert img.std() > 0.01  # not a blank canvas
    assert (img[..., :3] < 0.9).any(axis=-1).mean() > 0.01  # some ink: lines, text, axes


def test_sft_like_run_draws_four_panels(tmp_path):
    run = write_rows(tmp_path / "run", sft_rows(),
                     "run_dir: runs/x\nmodel: {source: tiny, dtype: float32, lora: {rank: 8}}\n"
                     "data: {path: builtin:arithmetic}\ntrain: {max_steps: 20, lr: 0.001}\n")
    metrics = read_metrics(run)
    panels = plan_panels(metrics)
    assert [p.name for p in panels] == ["loss", "lr", "throughput", "grad_norm"]
    assert panels[0].keys == ("loss", "eval_loss") and "mfu" in panels[2].keys
    assert len(draw_grid(metrics, panels).axes) == 4  # the MFU scale is no extra panel
    page = write_report(run)
    out = run / "report"
    assert page == out / "report.html"
    assert sorted(p.name for p in out.glob("*.png")) == sorted(
        ["report.png"] + [f"{p.name}.png" for p in panels])
    for p in panels:
        check_png(out / f"{p.name}.png")
    check_png(out / "report.png", shape=(2 * 340, 2 * 640))  # 2 x 2 panels at 100 dpi
    text = page.read_text()
    images = re.findall(B64 + "([A-Za-z0-9+/=]+)", text)
    assert len(images) == 4 and all(base64.b64decode(b).startswith(b"\x89PNG") for b in images)
    assert "<table>" in text and "eval_loss" in text and "nll_sum" not in text
    assert "hone sft --config" in text and "tiny (float32, LoRA rank 8)" in text
    assert "20 logged, last step 20 of 20" in text


def test_rl_run_with_rollback_plots_rerun_values_and_marks_events(tmp_path):
    run = write_rows(tmp_path / "rl", rl_rows(), "grpo: {group_size: 4, beta: 0.0}\n"
                     "rewards: {answer_match: 1.0}\nmodel: {source: tiny, dtype: float32}\n")
    metrics = read_metrics(run)
    assert metrics.series["loss"][8] == 0.8  # the re-run step, not the spike
    assert metrics.series["lr"][8] == 0.5e-4
    assert [(e.kind, e.step, e.back_to) for e in metrics.events] == [
        ("skip", 3, None), ("rollback", 8, 5)]
    panels = plan_panels(metrics)
    assert [p.name for p in panels] == ["loss", "reward", "kl", "lr", "throughput", "grad_norm",
                                        "guard"]
    assert panels[1].keys == ("reward_mean", "eval_reward") and panels[2].keys == ("kl",)
    assert len(draw_grid(metrics, panels).axes) == 7
    page = write_report(run, tmp_path / "out")
    check_png(tmp_path / "out" / "report.png", shape=(4 * 340, 2 * 640))
    check_png(tmp_path / "out" / "guard.png")
    text = page.read_text()
    assert text.count(B64) == 7
    assert "loss spike; rolled back to step 5" in text and "skipped" in text
    assert "hone grpo --config" in text and "group_size 4" in text


def test_rollback_drops_steps_that_were_not_rerun(tmp_path):
    run = write_rows(tmp_path / "rl", rl_rows()[:10] + [rl_row(6, lr_scale=0.5, rollbacks=1)])
    metrics = read_metrics(run)
    assert max(metrics.series["loss"]) == 6 and metrics.series["lr"][6] == 0.5e-4


def test_healthy_guard_counters_get_no_panel_and_old_pngs_go(tmp_path):
    run = write_rows(tmp_path / "run", [rl_row(s) for s in range(1, 4)])
    write_report(run)
    assert (run / "report" / "reward.png").exists()
    write_rows(run, sft_rows(3))
    write_report(run)
    assert not (run / "report" / "reward.png").exists()
    assert not (run / "report" / "guard.png").exists()
    assert "<li>none</li>" in (run / "report" / "report.html").read_text()


def report_error(capsys, run) -> str:
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hone report: error: ") and err.count("\n") == 1
    return err


def test_bad_input_exits_2_naming_file_and_line(tmp_path, capsys):
    assert "no such run folder" in report_error(capsys, tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    err = report_error(capsys, tmp_path / "empty")
    assert "metrics.jsonl" in err and "not found" in err
    run = write_rows(tmp_path / "bad", sft_rows(3))
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "loss": 0.\n')
    err = report_error(capsys, run)
    assert "metrics.jsonl" in err and "line 4" in err and "not valid JSON" in err
    (run / "metrics.jsonl").write_text('{"loss": 1.0}\n')
    err = report_error(capsys, run)
    assert "line 1" in err and "integer 'step'" in err
    (run / "metrics.jsonl").write_text("\n")
    assert "has no rows" in report_error(capsys, run)


def test_real_tiny_sft_run_through_the_cli(tmp_path):
    run = tmp_path / "tiny-sft"
    assert main(["sft", "--config", str(ROOT / "configs/tiny/sft.yaml"), f"run_dir={run}",
                 "train.max_steps=4", "log.sinks=[jsonl]", "checkpoint.every_steps=0",
                 "data.max_records=32"]) == 0
    done = subprocess.run([sys.executable, "-m", "hone.cli", "report", str(run)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    panels = plan_panels(read_metrics(run))
    assert [p.name for p in panels] == ["loss", "lr", "throughput", "grad_norm"]
    written = [Path(line) for line in done.stdout.split()]
    assert {p.name for p in written} == {"report.html", "report.png",
                                         *(f"{p.name}.png" for p in panels)}
    assert all(p.parent == run / "report" for p in written)
    check_png(run / "report" / "report.png", shape=(2 * 340, 2 * 640))
    check_png(run / "report" / "loss.png")
    text = (run / "report" / "report.html").read_text()
    assert text.count(B64) == 4 and "eval_loss" in text and "4 logged, last step 4 of 4" in text
