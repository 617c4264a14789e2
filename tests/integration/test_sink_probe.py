"""The load-time sink probe: its gauges on /metrics, and the warning for a
model that claims it needs no sinks but behaves as if it does.

The vanilla SmolLM2 file must report its strong sinks and not warn (auto pins
sinks for it). The softmax1 control of SmolLM2 (tools/retrofit_sinks.py
--softmax1: the original weights, normalizer softmax1) is probed too, and the
warning must appear exactly when its measured rate is above 10%. What that
rate is depends on the first token of the probe text (a finding, README):
on the built-in text, which starts with a word, the null key takes the
first-token mass (rate 0.00); on a text that starts with a newline, 49% of
the heads still park on that newline.
"""
import os
import subprocess
import sys

import pytest

from conftest import Server

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gauge(server, name):
    status, _, body = server.get("/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} missing from /metrics")


@pytest.fixture(scope="module")
def softmax1_model(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("retrofit") / "smollm2-softmax1.gguf"
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "retrofit_sinks.py"),
                    "--model", model, "--softmax1", "--out", str(out)], check=True)
    yield str(out)
    out.unlink()


def test_vanilla_model_reports_its_sinks_without_a_warning(binary, model):
    s = Server(binary, model, [])
    try:
        rate = gauge(s, "streamsink_sink_probe_rate")
        mass = gauge(s, "streamsink_sink_probe_first_token_mass")
        assert 0.3 < rate <= 1.0, rate  # SmolLM2 has strong sinks (about half its heads)
        assert 0.1 < mass < 1.0, mass
        assert "window-only eviction may hurt" not in s.log()
    finally:
        assert s.stop() == 0


def test_softmax1_declared_model_is_probed_and_warned_about_by_its_measured_rate(
        binary, model, softmax1_model):
    vanilla = Server(binary, model, [])
    try:
        vanilla_mass = gauge(vanilla, "streamsink_sink_probe_first_token_mass")
    finally:
        assert vanilla.stop() == 0
    s = Server(binary, softmax1_model, [])
    try:
        rate = gauge(s, "streamsink_sink_probe_rate")
        mass = gauge(s, "streamsink_sink_probe_first_token_mass")
        assert 0.0 <= rate <= 1.0, rate  # the probe ran (-1 means it did not)
        # the same weights with a null key: the first token's mass drops
        assert mass < vanilla_mass, (mass, vanilla_mass)
        warned = "window-only eviction may hurt" in s.log()
        assert warned == (rate > 0.10), (rate, s.log())
        assert "policy window" in s.log()  # auto evicts freely for softmax1
    finally:
        assert s.stop() == 0
