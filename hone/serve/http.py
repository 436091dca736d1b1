"""`hone serve`: an OpenAI-compatible HTTP server on the rollout engine.

Routes: POST /v1/chat/completions (hone/serve/chat.py says what a request may hold and what
comes back; `stream: true` sends server-sent events as the engine decodes), GET /v1/models,
GET /health. Every request is one engine request (hone/serve/engine_loop.py), so concurrent
clients share decode batches. Errors are OpenAI's shape: {"error": {"message", "type",
"param"}} with 400 for a request hone cannot serve and 500 when the engine fails.

The standard library's threading HTTP server carries it (one thread per connection, the engine
on its own thread): no web framework to install, and enough for an agent harness or a trainer
on the same machine. It has no authentication: bind it to localhost (the default) or a
trusted network.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jax

from hone.sampling.requests import Request
from hone.serve.chat import (BadRequest, chunk, messages_of, parse_request, reply_text, response,
                             split_calls)
from hone.serve.engine_loop import EngineLoop

TOOL_OPEN = "<tool_call>"


class Server:
    """The served model: start() binds and serves on a thread (url then says where);
    serve_forever() on the caller's; close() stops both the server and its engine."""

    def __init__(self, model, tokenizer, *, name: str = "hone", host: str = "127.0.0.1",
                 port: int = 8000, seed: int = 0, max_seqs: int = 8, max_len: int = 2048,
                 page_size: int = 64, timeout_s: float = 600.0, log=None, sessions=None,
                 version: int = 0, switch=None):
        """sessions: a hone.serve.sessions.Sessions that requests naming an episode are
        recorded in (a trainer's rollout); None: such requests are refused. version: the
        policy version `model` is recorded as in them; switch: a hone.agents.episode.Switch,
        whose weights sample an episode's turns from its `turn` on (asynchronous RL's partial
        episodes: a second engine over them, made when the first such turn comes, which may
        wait for the weights to exist)."""
        max_len = min(max_len, model.config.max_position_embeddings)
        self.tokenizer, self.name, self.seed, self.timeout_s = tokenizer, name, seed, timeout_s
        self.sessions = sessions
        self.eos = set(int(e) for e in getattr(tokenizer, "eos_ids", ()) or ())
        self.engine_kw = dict(eos_ids=sorted(self.eos), max_seqs=max_seqs, max_len=max_len,
                              page_size=page_size)  # the switch's engine is made alike
        self.loop = EngineLoop(model, **self.engine_kw)
        self.version, self.switch = version, switch
        self.later: EngineLoop | None = None  # the switch's engine, once a turn needs it
        self.later_lock = threading.Lock()
        self.failure: BaseException | None = None  # the switch's weights did not come
        self.arrivals = itertools.count()
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.http = ThreadingHTTPServer((host, port), _handler(self))
        self.http.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.http.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "Server":
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True,
                                       name="hone-serve-http")
        self.thread.start()
        return self

    def serve_forever(self) -> None:
        self.http.serve_forever()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.loop.close()
        if self.later is not None:
            self.later.close()

    def key(self, seed: int | None) -> jax.Array:
        """A request's sampling key: its own seed's, else the server's folded with its
        arrival number."""
        if seed is not None:
            return jax.random.key(seed)
        return jax.random.fold_in(jax.random.key(self.seed), next(self.arrivals))

    def submit(self, req):
        request = Request(req.prompt, req.max_tokens, self.key(req.seed), n=req.n)
        return self.loop.submit(request, req.settings)

    def episode_turn(self, req) -> dict:
        """A request of an episode (hone/serve/sessions.py): sampled after the episode's
        tokens with the trainer's settings, recorded, answered."""
        if self.sessions is None:
            raise BadRequest("this server records no episodes", "hone.episode")
        sessions = self.sessions
        session = sessions.get(req.episode)
        prompt, budget, key = sessions.prompt(session, req.messages, req.tool_list)
        if budget < 1:
            raise BadRequest("the episode has used its max_episode_tokens", "messages")
        req.prompt, req.settings = prompt, sessions.settings
        loop, version = self._engine_for(session.turns)
        pending = loop.submit(Request(prompt, budget, key, policy_version=version),
                              sessions.settings)
        sample = pending.samples(timeout=self.timeout_s)[0]
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        body = response(self.tokenizer, req, [sample], self.eos, rid)
        text, ended = reply_text(self.tokenizer, sample.tokens, self.eos)
        said = body["choices"][0]["message"]
        sessions.record(session, sample, text, ended,
                        messages_of({"messages": [said]})[0], version)
        return body

    def _engine_for(self, turn: int) -> tuple[EngineLoop, int]:
        """(the engine, the policy version) of an episode's model turn `turn` (0-based)."""
        s = self.switch
        if s is None or turn < s.turn:
            return self.loop, self.version
        with self.later_lock:
            if self.failure is not None:
                raise self.failure
            if self.later is None:
                try:
                    model = s.model()
                except BaseException as e:  # e.g. the lag's Cancelled: kept for the trainer
                    self.failure = e
                    raise
                self.later = EngineLoop(model, **self.engine_kw)
        return self.later, s.version


def _handler(server: Server):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet: one line per request would flood a run
            pass

        def _json(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, param: str | None = None) -> None:
            kind = "invalid_request_error" if status < 500 else "server_error"
            self._json(status, {"error": {"message": message, "type": kind, "param": param,
                                          "code": None}})

        def do_GET(self):
            path = self.path.rstrip("/")
            if path.endswith("/models"):
                self._json(200, {"object": "list", "data": [
                    {"id": server.name, "object": "model", "created": 0, "owned_by": "hone"}]})
            elif path.endswith("/health"):
                self._json(200, {"status": "ok"})
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self):
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._error(404, f"no route {self.path}")
                return
            try:
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size) or b"null")
                req = parse_request(body, server.tokenizer, server.name, server.loop.max_len)
            except json.JSONDecodeError as e:
                self._error(400, f"the body is not JSON ({e.msg})")
                return
            except BadRequest as e:
                self._error(400, str(e), e.field)
                return
            try:
                if req.episode is not None:
                    self._json(200, server.episode_turn(req))
                    return
                pending = server.submit(req)
                rid = f"chatcmpl-{uuid.uuid4().hex}"
                if req.stream:
                    self._stream(req, pending, rid)
                else:
                    samples = pending.samples(timeout=server.timeout_s)
                    self._json(200, response(server.tokenizer, req, samples, server.eos, rid))
            except BadRequest as e:
                self._error(400, str(e), e.field)
            except Exception as e:  # noqa: BLE001 - the engine's failure, told to the client
                self._error(500, f"{type(e).__name__}: {e}")

        def _send(self, obj) -> None:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
            data += b"\n\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _stream(self, req, pending, rid: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            created, tok = int(time.time()), server.tokenizer
            ids = [[] for _ in range(req.n)]
            lps = [[] for _ in range(req.n)]
            sent = [0] * req.n  # characters of each choice's text already sent
            for k in range(req.n):
                self._send(chunk(req, rid, created, {"role": "assistant", "content": ""}, k))
            left = req.n
            while left:
                kind, *rest = pending.events.get(timeout=server.timeout_s)
                if kind == "error":
                    raise rest[0]
                k = rest[0]
                if kind == "tokens":
                    ids[k] += rest[1]
                    lps[k] += rest[2]
                    text, _ = reply_text(tok, ids[k], server.eos)
                    shown = text if not req.tools else text.split(TOOL_OPEN, 1)[0]
                    if shown.endswith("\ufffd"):  # a character still coming in pieces
                        continue
                    if len(shown) > sent[k]:
                        self._send(chunk(req, rid, created, {"content": shown[sent[k]:]}, k))
                        sent[k] = len(shown)
                    continue
                sample = rest[1]  # done
                left -= 1
                text, ended = reply_text(tok, sample.tokens, server.eos)
                content, calls = split_calls(text, req.tools)
                rest_text = (text if not calls else (content or ""))[sent[k]:]
                if rest_text and not calls:
                    self._send(chunk(req, rid, created, {"content": rest_text}, k))
                if calls:
                    self._send(chunk(req, rid, created, {"tool_calls": [
                        dict(c, index=i) for i, c in enumerate(calls)]}, k))
                finish = "tool_calls" if calls else "stop" if ended else "length"
                self._send(chunk(req, rid, created, {}, k, finish, extra={"hone": {
                    "token_ids": list(sample.tokens), "logprobs": list(sample.logprobs),
                    "prompt_token_ids": list(req.prompt)}}))
            self._send(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler
