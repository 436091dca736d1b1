"""`hone report RUN_DIR`: a run's metrics as PNG plots and one self-contained HTML page.

Design choices:
- Only metrics.jsonl and config.yaml are read, and JAX is never imported for a healthy run: a
  report works on a finished run, a running one, or a copy without its checkpoints.
- Rows are replayed in order. A `guard/rollback_to` row undoes every value logged after the step
  it returns to (the re-run steps log theirs again), so each curve shows the run the checkpoints
  hold; a step logged twice keeps its latest values.
- Panels group keys by meaning (`PANELS`, `panel_of`), and a panel is drawn only when the run
  logged one of its keys, so one code path reports SFT, DPO, reward, RL and distillation runs.
  Guard events are vertical markers on every panel: rollbacks red (the undone steps shaded),
  skipped non-finite steps orange.
- The HTML embeds the PNGs as base64 data URIs: one file that opens offline and can be mailed.
- matplotlib draws on `Figure` objects with the Agg canvas, never pyplot: no display, no global
  figure state, and `hone --help` does not pay for the import.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hone.errors import InputError

# (file stem, title) of every panel, in page order.
PANELS = (("loss", "Loss"), ("reward", "Reward"), ("kl", "KL"), ("accuracy", "Accuracy"),
          ("lr", "Learning rate"), ("throughput", "Throughput (tokens/s)"),
          ("grad_norm", "Gradient norm"), ("guard", "Guard counters"))
# Which way is better, for the table's "best" column; other panels have no best.
_BEST = {"loss": min, "reward": max, "accuracy": max, "throughput": max}
_GUARD_KEYS = ("guard/skipped", "guard/rollbacks", "guard/lr_scale")
# The algorithm settings shown in the header; the command is the config's algorithm section.
_SETTINGS = {"grpo": ("group_size", "scale", "loss_agg", "ratio", "clip_eps", "beta"),
             "ppo": ("critic", "kl_coef", "gamma", "lam", "clip_eps"),
             "distill": ("mode", "kind", "temperature", "alpha"),
             "dpo": ("loss_type", "beta", "reference", "online"),
             "reward": ("margin", "center_coef")}


@dataclass(frozen=True)
class GuardEvent:
    step: int  # the step the guard acted at
    kind: str  # "rollback" or "skip"
    text: str  # one line for the page
    back_to: int | None = None  # rollbacks: the checkpoint step training resumed from


@dataclass
class Metrics:
    path: Path
    series: dict[str, dict[int, float]] = field(default_factory=dict)  # key -> step -> value
    events: list[GuardEvent] = field(default_factory=list)
    rows: int = 0  # lines read, rollback rows included


@dataclass(frozen=True)
class Panel:
    name: str  # file stem of its PNG
    title: str
    keys: tuple[str, ...]


def _number(v) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if v in ("nan", "inf", "-inf"):  # how JsonlSink writes non-finite floats
        return float(v)
    return None


def read_metrics(run_dir) -> Metrics:
    """Every numeric key of run_dir/metrics.jsonl as step -> latest value, and the guard events.
    InputError (naming the file and line) for a missing folder or file, a bad line, no rows."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError("no such run folder (the run_dir of a training config)",
                         path=str(run_dir))
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise InputError("not found: this run logged no metrics; train it with 'jsonl' in "
                         "log.sinks (the default)", path=str(path))
    m, skipped = Metrics(path), 0.0
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"line {n}: not valid JSON ({e.msg}, column {e.colno}); fix or "
                             f"delete that line", path=str(path)) from None
        if not isinstance(row, dict) or type(row.get("step")) is not int:
            raise InputError(f"line {n}: expected a JSON object with an integer 'step'",
                             path=str(path))
        m.rows, step = m.rows + 1, row["step"]
        if "guard/rollback_to" in row:
            if type(back := row["guard/rollback_to"]) is not int:
                raise InputError(f"line {n}: 'guard/rollback_to' is not a step", path=str(path))
            from hone.train.guards import REASONS  # imports JAX: only for runs that rolled back
            why = REASONS.get(int(row.get("guard/tripped", 0)), "guard tripped")
            m.events.append(GuardEvent(step, "rollback", f"step {step}: {why}; rolled back to "
                                       f"step {back}", back))
            for values in m.series.values():
                for s in [s for s in values if s > back]:
                    del values[s]
            continue  # its counters come again with the next logged row
        now = _number(row.get("guard/skipped"))
        if now is not None and now > skipped:
            m.events.append(GuardEvent(step, "skip", f"by step {step}: {now - skipped:g} "
                                       f"non-finite step(s) skipped"))
            skipped = now
        for key, v in row.items():
            if key != "step" and (x := _number(v)) is not None:
                m.series.setdefault(key, {})[step] = x
    if not m.rows:
        raise InputError("has no rows: the run stopped before its first logged step",
                         path=str(path))
    return m


def panel_of(key: str) -> str | None:
    """The panel a metric key is drawn in, or None (sums, counts, timings, other numbers)."""
    if key.endswith(("_sum", "_denominator")) or key.startswith(("events/", "profile/")):
        return None
    if key.startswith("guard/"):
        return "guard" if key in _GUARD_KEYS else None
    bare = key.removeprefix("eval_").removeprefix("eval/")
    if "accuracy" in bare or "agree" in bare:
        return "accuracy"
    if bare == "loss" or bare.endswith("_loss"):
        return "loss"
    if bare.startswith("kl") and bare not in ("kl_coef", "kl_kind"):
        return "kl"
    if (bare.startswith("reward") and "std" not in bare) or bare in ("margin", "score_mean"):
        return "reward"
    return {"lr": "lr", "tokens_per_s": "throughput", "mfu": "throughput",
            "grad_norm": "grad_norm"}.get(key)


def plan_panels(metrics: Metrics) -> list[Panel]:
    """The panels this run has data for, in page order. The guard counters get a panel only
    when the guard acted: a healthy run's flat zeros say no more than 'no guard events'."""
    keys: dict[str, list[str]] = {}
    for key in sorted(metrics.series, key=lambda k: (k.startswith("eval"), k)):
        if metrics.series[key] and (name := panel_of(key)):
            keys.setdefault(name, []).append(key)
    acted = metrics.events or any(v != (1.0 if k == "guard/lr_scale" else 0.0)
                                  for k in keys.get("guard", ())
                                  for v in metrics.series[k].values())
    return [Panel(name, title, tuple(keys[name])) for name, title in PANELS
            if name in keys and (name != "guard" or acted)]


def _draw(ax, panel: Panel, metrics: Metrics) -> None:
    from matplotlib.ticker import MaxNLocator
    lines = [k for k in panel.keys if not (k == "mfu" and "tokens_per_s" in panel.keys)]
    colors = {}
    for key in lines:  # MFU is tokens/s times a constant: a second scale on the same line
        steps, values = zip(*sorted(metrics.series[key].items()))
        train = colors.get(key.removeprefix("eval_"))  # eval_x: x's colour, dashed, squares
        (line,) = ax.plot(steps, values, lw=1.2, ms=5 if train else 3, label=key, color=train,
                          marker="s" if train else "o" if len(steps) <= 20 else None,
                          ls="--" if train else "-", mfc="white" if train else None)
        colors[key] = line.get_color()
    if "mfu" in panel.keys and "tokens_per_s" in panel.keys:
        tps, mfu = metrics.series["tokens_per_s"], metrics.series["mfu"]
        c = next((mfu[s] / tps[s] for s in mfu if tps.get(s)), 0.0)
        if c > 0:
            ax.secondary_yaxis("right", functions=(lambda x: x * c * 100, lambda y: y / c / 100)
                               ).set_ylabel("MFU (%)")
    for e in metrics.events:
        if e.kind == "rollback":
            ax.axvspan(e.back_to, e.step, color="tab:red", alpha=0.08)
        ax.axvline(e.step, color="tab:red" if e.kind == "rollback" else "tab:orange",
                   ls="--" if e.kind == "rollback" else ":", lw=1)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if panel.name == "lr":
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    if len(lines) > 1:
        ax.legend(fontsize=7)


def draw_grid(metrics: Metrics, panels: list[Panel], title: str = ""):
    """Every panel on one Agg figure, two columns; the figure has one Axes per panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    cols = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(6.4 * cols, 3.4 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    for i, panel in enumerate(panels):
        _draw(fig.add_subplot(rows, cols, i + 1), panel, metrics)
    if title:
        fig.suptitle(title)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _describe(cfg: dict, run_dir: Path) -> list[tuple[str, str]]:
    """Header lines from the resolved config: the command, model, algorithm and data."""
    command = next((c for c in _SETTINGS if c in cfg), "sft")  # RL configs have 'rewards:'
    m = cfg.get("model") or {}
    lora = m.get("lora") or {}
    model = f"{m.get('source')} ({m.get('dtype')}"
    model += f", LoRA rank {lora['rank']}" if lora.get("rank") else ", full fine-tuning"
    model += f", {lora['quantize']} base)" if lora.get("quantize", "none") != "none" else ")"
    if "teacher" in cfg:
        model += f"; teacher {(cfg['teacher'] or {}).get('source')}"
    section = cfg.get(command) or {}
    algo = ", ".join(f"{k} {section[k]}" for k in _SETTINGS.get(command, ()) if k in section)
    t, d = cfg.get("train") or {}, cfg.get("data") or {}
    lines = [("command", f"hone {command} --config {run_dir / 'config.yaml'}"),
             ("model", model), ("algorithm", f"{command}" + (f": {algo}" if algo else "")),
             ("data", f"{d.get('path')} (eval {d.get('eval_path')})" if d else ""),
             ("train", ", ".join(f"{k} {t[k]}" for k in ("max_steps", "batch_size", "lr",
                                                           "schedule") if k in t))]
    return [(k, v) for k, v in lines if v]


def _table(metrics: Metrics, panels: list[Panel]) -> str:
    cells = ["<tr><th>metric</th><th>first</th><th>last</th><th>best</th></tr>"]
    for panel in panels:
        for key in panel.keys:
            pts = sorted(metrics.series[key].items())
            best = "&ndash;"
            finite = [p for p in pts if math.isfinite(p[1])]
            if panel.name in _BEST and finite:
                s, v = _BEST[panel.name](finite, key=lambda p: p[1])
                best = f"{v:.5g} (step {s})"
            cells.append(f"<tr><td>{html.escape(key)}</td><td>{pts[0][1]:.5g} (step "
                         f"{pts[0][0]})</td><td>{pts[-1][1]:.5g} (step {pts[-1][0]})</td>"
                         f"<td>{best}</td></tr>")
    return "<table>" + "\n".join(cells) + "</table>"


_CSS = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:left;font-size:13px}img{max-width:100%}"
        "dt{font-weight:bold;float:left;width:7em}dd{margin-left:8em}")


def report_files(out_dir) -> list[Path]:
    """The files a report in out_dir consists of (what write_report wrote there)."""
    out_dir = Path(out_dir)
    names = ["report.html", "report.png"] + [f"{name}.png" for name, _ in PANELS]
    return [out_dir / n for n in names if (out_dir / n).exists()]


def write_report(run_dir, out_dir=None) -> Path:
    """Write report.html, report.png (every panel) and one PNG per panel into out_dir (default
    run_dir/report); returns the HTML's path."""
    run_dir = Path(run_dir)
    metrics = read_metrics(run_dir)
    panels = plan_panels(metrics)
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / "config.yaml"
    try:
        cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
    except yaml.YAMLError as e:
        raise InputError(f"not valid YAML ({e})", path=str(cfg_path)) from None
    header = _describe(cfg, run_dir) if isinstance(cfg, dict) and cfg else [
        ("config", "no config.yaml in the run folder")]
    steps = sorted({s for values in metrics.series.values() for s in values})
    max_steps = (cfg.get("train") or {}).get("max_steps") if isinstance(cfg, dict) else None
    header.append(("steps", f"{len(steps)} logged, last step {steps[-1] if steps else '-'}"
                   + (f" of {max_steps}" if max_steps else "") + f" ({metrics.rows} rows)"))
    for name, _ in PANELS:  # a panel an earlier report drew but this one does not
        (out_dir / f"{name}.png").unlink(missing_ok=True)
    images = []
    for panel in panels:
        data = _png(draw_grid(metrics, [panel]))
        (out_dir / f"{panel.name}.png").write_bytes(data)
        images.append((panel, base64.b64encode(data).decode("ascii")))
    if panels:
        (out_dir / "report.png").write_bytes(_png(draw_grid(metrics, panels, run_dir.name)))
    events = "".join(f"<li>{html.escape(e.text)}</li>" for e in metrics.events)
    page = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>hone report: "
            f"{html.escape(run_dir.name)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{html.escape(run_dir.name)}</h1><dl>",
            *(f"<dt>{k}</dt><dd>{html.escape(str(v))}</dd>" for k, v in header), "</dl>",
            f"<h2>Guard events</h2><ul>{events or '<li>none</li>'}</ul>",
            "<p>On the plots: red dashed line, a rollback (shaded, the steps it undid); orange "
            "dotted line, skipped non-finite steps.</p>" if metrics.events else "",
            "<h2>Metrics</h2>", _table(metrics, panels),
            *(f"<h2>{html.escape(p.title)}</h2><img alt='{p.name}' "
              f"src='data:image/png;base64,{b64}'>" for p, b64 in images),
            "</body></html>"]
    html_path = out_dir / "report.html"
    html_path.write_text("\n".join(page), encoding="utf-8")
    return html_path
