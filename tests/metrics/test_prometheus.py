"""The prometheus sink: it serves the latest logged values as hone_* gauges, frees its port on
close, serves from process 0 only, and serves live values while a tiny SFT run trains."""

import io
import json
import math
import urllib.error
import urllib.request
from pathlib import Path

import jax
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import hone.train.loop
from hone.config import SFTConfig, load_config
from hone.errors import InputError
from hone.metrics.prometheus import PrometheusSink, metric_name
from hone.metrics.sinks import make_sinks
from hone.recipes.sft import run_sft

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs/tiny/sft.yaml")


def scrape(url: str) -> dict[str, float]:
    """name -> value of every sample at a /metrics endpoint."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples}


def sink(**kw) -> PrometheusSink:
    return PrometheusSink(0, "127.0.0.1", stream=io.StringIO(), **kw)


def test_names_are_sanitised_and_prefixed():
    assert metric_name("loss") == "hone_loss"
    assert metric_name("events/reward_timeout") == "hone_events_reward_timeout"
    assert metric_name("guard.skipped-steps") == "hone_guard_skipped_steps"


def test_a_written_row_is_served_and_close_frees_the_port():
    s, other = sink(), sink()  # own registries: two sinks in one process do not collide
    s.write(7, {"loss": 1.25, "tokens_per_s": np.float32(10.5), "events/reward_timeout": 3,
                "diverged": float("inf"), "flag": True, "name": "x", "vec": np.ones(3)})
    other.write(1, {"loss": 9.0})
    got = scrape(s.url)
    assert got["hone_step"] == 7 and got["hone_loss"] == 1.25 and got["hone_tokens_per_s"] == 10.5
    assert got["hone_events_reward_timeout"] == 3 and got["hone_flag"] == 1
    assert math.isnan(got["hone_diverged"])
    assert "hone_name" not in got and "hone_vec" not in got
    s.write(8, {"loss": 1.0})  # a later row updates its keys and keeps the others
    got = scrape(s.url)
    assert got["hone_step"] == 8 and got["hone_loss"] == 1.0 and got["hone_tokens_per_s"] == 10.5
    assert scrape(other.url)["hone_loss"] == 9.0
    port = s.port
    s.close()
    other.close()
    with pytest.raises(urllib.error.URLError):
        scrape(f"http://127.0.0.1:{port}/metrics")
    again = PrometheusSink(port, "127.0.0.1", stream=io.StringIO())  # the next run can bind it
    again.close()


def test_chosen_port_is_printed():
    stream = io.StringIO()
    s = PrometheusSink(0, "127.0.0.1", stream=stream)
    s.close()
    assert f"http://127.0.0.1:{s.port}/metrics" in stream.getvalue()


def test_only_process_0_serves(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    assert make_sinks(["prometheus"], tmp_path, max_steps=1, resume_step=None,
                      prometheus_port=0) == []


@pytest.mark.parametrize("port", ["-1", "65536"])
def test_ports_outside_0_to_65535_are_rejected(port):
    with pytest.raises(InputError) as info:
        load_config(SFTConfig, None, [f"log.prometheus_port={port}"])
    assert info.value.key == "log.prometheus_port"


def test_live_values_during_a_tiny_sft_run(tmp_path, monkeypatch):
    """Each logged row is scraped over HTTP right after the loop writes it, mid-run."""
    scraped, built = [], []
    real_make_sinks = hone.train.loop.make_sinks

    class Scraping:
        def __init__(self, inner):
            self.inner = inner

        def write(self, step, metrics):
            self.inner.write(step, metrics)
            scraped.append(scrape(self.inner.url))

        def close(self):
            self.inner.close()

    def make_sinks_spy(*args, **kwargs):
        built.append(kwargs)
        return [Scraping(s) if isinstance(s, PrometheusSink) else s
                for s in real_make_sinks(*args, **kwargs)]

    monkeypatch.setattr(hone.train.loop, "make_sinks", make_sinks_spy)
    cfg = load_config(SFTConfig, TINY, [
        f"run_dir={tmp_path}", "log.sinks=[jsonl, prometheus]", "log.prometheus_port=0",
        "train.max_steps=3", "checkpoint.every_steps=0", "train.eval_batches=1"])
    run_sft(cfg, log=lambda s: None)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["hone_step"] for r in scraped] == [r["step"] for r in rows] == [1, 2, 3]
    for got, row in zip(scraped, rows):
        assert got["hone_loss"] == row["loss"] and got["hone_tokens_per_s"] == row["tokens_per_s"]
    assert scraped[-1]["hone_eval_loss"] == rows[-1]["eval_loss"]
    assert built[0].get("prometheus_port") == 0, "loop.py must pass log.prometheus_port"
