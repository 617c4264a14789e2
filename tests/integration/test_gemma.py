"""Gemma 3 270M served end to end with the official openai client: completions
(streamed and not, greedy, the same text), a chat in Gemma's turn format, and
a stream that runs past the local layers' 512-token window. Skips only when
the Gemma file is absent (scripts/fetch-model.sh gemma3-270m)."""
import pytest

from conftest import Server
from session_util import call, complete


@pytest.fixture(scope="module")
def gemma(binary, gemma_model):
    s = Server(binary, gemma_model, ["--max-seqs", "2", "--window", "1024"])
    yield s
    rc = s.stop()
    assert rc == 0, s.log()


def test_gemma_greedy_completion_streams_the_same_text_as_it_returns(gemma):
    c = gemma.client()
    whole = c.completions.create(model="smol", prompt="The capital of France is",
                                 max_tokens=12, temperature=0)
    text = whole.choices[0].text
    # transformers' greedy continuation starts with token 506 (" the"), the
    # fixture's top-1 at the prompt's last position (tests/fixtures/logits_gemma3.txt)
    assert text.startswith(" the"), text
    pieces = [ch.choices[0].text for ch in c.completions.create(
        model="smol", prompt="The capital of France is", max_tokens=12, temperature=0,
        stream=True) if ch.choices]
    assert "".join(pieces) == text
    assert whole.usage.prompt_tokens == 6  # BOS + 5, as transformers tokenizes it


def test_gemma_chat_answers_in_its_turn_format(gemma):
    c = gemma.client()
    out = []
    for ch in c.chat.completions.create(
            model="smol", messages=[{"role": "user",
                                     "content": "What is the tallest mountain on Earth?"}],
            max_tokens=24, temperature=0, stream=True):
        if ch.choices and ch.choices[0].delta.content:
            out.append(ch.choices[0].delta.content)
    text = "".join(out)
    assert text.strip(), text
    assert "<start_of_turn>" not in text and "<end_of_turn>" not in text


def test_gemma_streams_past_the_local_window(gemma):
    c = gemma.client()
    prompt = "The river ran past the old mill and under the stone bridge. " * 60
    pieces = []
    usage = None
    for ch in c.completions.create(model="smol", prompt=prompt, max_tokens=16, temperature=0,
                                   stream=True, stream_options={"include_usage": True}):
        if ch.choices:
            pieces.append(ch.choices[0].text)
        if ch.usage:
            usage = ch.usage
    assert usage is not None and usage.prompt_tokens > 512  # the local layers slide
    assert "".join(pieces).strip()


def test_gemma_session_save_is_refused_clearly_and_the_session_stays_usable(binary, gemma_model,
                                                                          tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, gemma_model, ["--max-seqs", "2", "--window", "1024",
                                     "--session-dir", str(d)])
    try:
        status, body = complete(s, "The capital of France is", "g1", max_tokens=4)
        assert status == 200, body
        status, body = call(s, "POST", "/v1/sessions/g1/save")
        assert status == 400, body
        assert "local attention layers" in body["error"]["message"], body
        status, body = complete(s, " and", "g1", max_tokens=4)  # still in memory
        assert status == 200, body
    finally:
        assert s.stop() == 0, s.log()
