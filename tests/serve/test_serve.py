"""hone serve through the `openai` client on the tiny preset: the sampled ids of a request are
those of the engine given the same key, whatever else is served at once; streaming sends the same
reply; tools, tool calls and tool messages round-trip in OpenAI's format; what hone cannot serve
is a 400 naming the field."""

from __future__ import annotations

import json
import threading
import urllib.request

import jax
import numpy as np
import pytest

from hone.sampling.requests import Request, Sample
from hone.sampling.scheduler import PagedEngine
from hone.serve import Server
from hone.serve.chat import ChatRequest, choice, parse_request, render
from hone.serve.engine_loop import Settings
from hone.tokenizer import load_tokenizer
from hone.weights.loading import load_model

openai = pytest.importorskip("openai")

TOL = 1e-4
HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
ADD = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}}, "required": ["a"]}}}


@pytest.fixture(scope="module")
def served():
    model, tok = load_model("tiny", seed=3), load_tokenizer("tiny")
    server = Server(model, tok, name="tiny", port=0, max_seqs=4, max_len=512,
                    page_size=16).start()
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
    yield model, tok, server, client
    server.close()


def alone(model, tok, messages, seed, max_tokens, tools=None):
    """The engine's own answer to the request, served alone."""
    prompt = render(tok, messages, tools)
    out = PagedEngine(model, max_seqs=1, max_len=512, page_size=16).run(
        [Request(prompt, max_tokens, jax.random.key(seed))], temperature=1.0,
        eos_ids=tuple(tok.eos_ids))
    return prompt, out[0][0]


def test_a_reply_carries_the_engines_ids_and_logprobs(served):
    model, tok, _, client = served
    r = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, seed=5,
                                       logprobs=True)
    prompt, want = alone(model, tok, HELLO, 5, 12)
    got = r.choices[0].model_extra["hone"]
    assert got["token_ids"] == want.tokens and r.model_extra["hone"]["prompt_token_ids"] == prompt
    np.testing.assert_allclose(got["logprobs"], want.logprobs, atol=TOL)
    np.testing.assert_allclose([c.logprob for c in r.choices[0].logprobs.content],
                               want.logprobs, atol=TOL)
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(want.tokens)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.choices[0].message.content == tok.decode(
        want.tokens[:-1] if want.tokens[-1] in tok.eos_ids else want.tokens)
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_concurrent_requests_get_what_each_gets_alone(served):
    model, tok, _, client = served
    results = {}

    def ask(seed):
        r = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=10 + seed,
                                           seed=seed, n=2)
        results[seed] = [c.model_extra["hone"]["token_ids"] for c in r.choices]

    threads = [threading.Thread(target=ask, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for seed in range(6):  # sample j of a request draws with fold_in(key(seed), j)
        prompt = render(tok, HELLO, None)
        out = PagedEngine(model, max_seqs=2, max_len=512, page_size=16).run(
            [Request(prompt, 10 + seed, jax.random.key(seed), n=2)], temperature=1.0,
            eos_ids=tuple(tok.eos_ids))[0]
        assert results[seed] == [s.tokens for s in out]


def test_streaming_sends_the_same_reply_in_pieces(served):
    _, tok, _, client = served
    whole = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=16, seed=9)
    stream = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=16, seed=9,
                                            stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices[0].delta.content]) >= 2  # it came in pieces
    last = chunks[-1].choices[0]
    assert last.finish_reason == whole.choices[0].finish_reason
    assert last.model_extra["hone"]["token_ids"] == whole.choices[0].model_extra["hone"][
        "token_ids"]


def test_tools_and_tool_messages_render_as_the_agents_sampler_renders_them(served):
    _, tok, _, _ = served
    messages = [
        {"role": "user", "content": "1+2, 3+4?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add",
                                                          "arguments": '{"a": 1, "b": 2}'}},
            {"id": "c2", "type": "function", "function": {"name": "add",
                                                          "arguments": '{"a": 3, "b": 4}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "tool", "tool_call_id": "c2", "content": "7"}]  # two in a row
    # What the client sends (the tiny model's 512 positions are too few to sample after it).
    body = json.loads(json.dumps({"model": "tiny", "messages": messages, "tools": [ADD]}))
    req = parse_request(body, tok, "tiny", context=4096)
    from hone.agents.tool_messages import for_template
    msgs, extra = for_template(
        [dict(m, content=m["content"] or "", **({"tool_calls": [
            dict(c, function=dict(c["function"], arguments=json.loads(
                c["function"]["arguments"]))) for c in m["tool_calls"]]}
            if m.get("tool_calls") else {})) for m in messages], [ADD], tok.chat_template)
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, **extra)
    assert tok.decode(req.prompt) == text
    assert '"name": "add"' in text and "<|im_start|>tool\n7" in text


def test_a_reply_with_tool_calls_comes_back_as_openai_tool_calls(served):
    _, tok, _, _ = served
    said = ('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
            '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 6}}\n'
            '</tool_call>')
    ids = tok.encode(said, add_special_tokens=False) + [tok.eos_ids[0]]
    req = ChatRequest(prompt=[1], settings=Settings(), n=1, max_tokens=9, seed=None,
                      stream=False, logprobs=False, tools=True, model="tiny", body={},
                      messages=[], tool_list=None, episode=None)
    c = choice(tok, req, 0, Sample(tokens=ids, logprobs=[0.0] * len(ids)), set(tok.eos_ids))
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] == "Let me add."
    calls = c["message"]["tool_calls"]
    assert [(x["function"]["name"], json.loads(x["function"]["arguments"])) for x in calls] == [
        ("add", {"a": 1, "b": 2}), ("add", {"a": 5, "b": 6})]
    assert c["hone"]["token_ids"] == ids  # the ids as sampled, never the text again


@pytest.mark.parametrize("extra,field", [
    ({"stop": ["\n"]}, "stop"), ({"temperature": 0.0, "n": 2}, "n"),
    ({"top_logprobs": 3, "logprobs": True}, "top_logprobs"), ({"max_tokens": 0}, "max_tokens")])
def test_what_hone_cannot_serve_is_a_400_naming_the_field(served, extra, field):
    _, _, server, client = served
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=HELLO, **extra)
    assert err.value.body["param"] == field
    with urllib.request.urlopen(server.url.rsplit("/v1", 1)[0] + "/v1/health") as r:
        assert json.load(r) == {"status": "ok"}  # still serving
