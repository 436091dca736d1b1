"""`hone serve`: the rollout engine behind an OpenAI-compatible chat-completions endpoint
(hone/serve/http.py), for outside agent harnesses and for trainers that collect token-exact
trajectories from them."""

from hone.serve.http import Server

__all__ = ["Server"]
