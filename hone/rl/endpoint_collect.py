"""Agent episodes played by an outside process through an OpenAI-compatible endpoint
(`agent.endpoint`): the environment is somebody else's program, the trajectories are hone's.

Each rollout (and each greedy evaluation) serves the policy's current weights with `hone serve`
on a free local port (hone/serve/http.py), with a `Sessions` record (hone/serve/sessions.py)
that keeps every episode token-exact: the opening and the environment's turns rendered with the
chat template, the model's ids exactly as sampled with their log-probs. Then it runs the
endpoint command once:

    environment:  HONE_BASE_URL (".../v1"), HONE_MODEL, HONE_API_KEY ("none")
    stdin:        one JSON task a line: {"episode": "i-j", "example": {record}, "seed": int}
    stdout:       one JSON result a line per episode: {"episode": "i-j", "reward": number}
                  (other lines are the program's own output and are ignored)

and the program plays the episodes however it likes (one after the other or at once, with the
`openai` client or plain HTTP), sending `"hone": {"episode": "i-j"}` in each request's body
(`extra_body` in the openai client). The run's temperature, top-k, top-p, max_new_tokens and
episode limits apply whatever the program asks for. Episode i-j samples with keys of the run's
seed, the step and its number alone, so with a deterministic program a rollout is a function of
the weights and the data, like the in-process environments' (resume stays exact).

Partial episodes (agent.switch_turn with a policy lag): the server answers each episode's turns
from the switch's on with the next version's weights (hone/serve/http.py `Server(switch=)`), and
the sessions record the version of every sampled token; a version that will not come (a
rollback, a stop) fails the waiting requests and is raised here once the program is done.

A program that exits with an error or runs past `agent.endpoint_timeout_s` stops the rollout
with an error naming the command and the end of its stderr; an episode it gives no reward gets
0 (counted as `agent/missing_rewards`).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from typing import Sequence

from hone.agents.episode import Episode, Switch, episode_seed
from hone.errors import InputError
from hone.rl.episode_collect import AgentRollouts
from hone.serve.engine_loop import Settings
from hone.serve.http import Server
from hone.serve.sessions import Sessions


def endpoint_command(cfg, log=print) -> list[str]:
    """The endpoint's argv, checked before the run starts (the program must exist)."""
    argv = shlex.split(cfg.agent.endpoint or "")
    if not argv or shutil.which(argv[0]) is None:
        raise InputError(f"{cfg.agent.endpoint!r} does not name a program found on PATH",
                         key="agent.endpoint")
    log(f"agent: episodes played by {cfg.agent.endpoint!r} through hone serve")
    return argv


def results(stdout: str, ids: Sequence[str]) -> dict[str, float]:
    """{episode: reward} from the program's output lines; a result line with a bad reward or
    an unknown episode is an error naming the line."""
    known, out = set(ids), {}
    for n, line in enumerate(stdout.splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict) or "episode" not in row:
            continue
        reward = row.get("reward")
        if row["episode"] not in known or isinstance(reward, bool) or not isinstance(
                reward, (int, float)):
            raise InputError(f"stdout line {n}: {line[:200]!r} needs a known episode and a "
                             f"numeric reward", key="agent.endpoint")
        out[row["episode"]] = float(reward)
    return out


class EndpointRollouts(AgentRollouts):
    """AgentRollouts whose episodes an outside program plays (the module doc)."""

    def __init__(self, cfg, section, graphdef, template, frozen, tokenizer, prompts, argv,
                 turn_gamma: float | None = None):
        super().__init__(cfg, section, graphdef, template, frozen, tokenizer, prompts, None,
                         turn_gamma=turn_gamma)
        self.argv = argv

    def describe(self) -> str:
        return f"one per episode (played by {self.a.endpoint!r})"

    def play(self, model, records: list[dict], group_size: int, seed: int,
             temperature: float | None = None, version: int = 0,
             switch: Switch | None = None) -> list[Episode]:
        s, a, g = self.s, self.a, group_size
        temperature = s.temperature if temperature is None else temperature
        greedy = temperature == 0
        settings = Settings(temperature, None if greedy else s.top_k,
                            None if greedy else s.top_p)
        ids = [f"{i}-{j}" for i in range(len(records)) for j in range(g)]
        sessions = Sessions(self.tokenizer, seed=seed, settings=settings,
                            max_new_tokens=s.max_new_tokens, max_episode_tokens=a.max_episode_tokens,
                            max_opening_tokens=s.max_prompt_tokens,
                            numbers={e: k for k, e in enumerate(ids)},
                            template_args=a.template_kwargs())
        tasks = "".join(json.dumps({"episode": ids[i * g + j], "example": r,
                                    "seed": episode_seed(seed, i, j)}) + "\n"
                        for i, r in enumerate(records) for j in range(g))
        server = Server(model, self.tokenizer, name="policy", port=0,
                        max_seqs=s.max_seqs or min(64, len(ids)), max_len=a.max_episode_tokens,
                        sessions=sessions, timeout_s=a.endpoint_timeout_s, version=version,
                        switch=switch).start()
        env = dict(os.environ, HONE_BASE_URL=server.url, HONE_MODEL="policy",
                   HONE_API_KEY="none")
        try:
            done = subprocess.run(self.argv, input=tasks, capture_output=True, text=True,
                                  env=env, timeout=a.endpoint_timeout_s)
        except subprocess.TimeoutExpired as e:
            raise InputError(f"{a.endpoint!r} ran past agent.endpoint_timeout_s "
                             f"({a.endpoint_timeout_s:g} s); its stderr ended: "
                             f"{_tail(e.stderr)}", key="agent.endpoint") from None
        finally:
            server.close()
        if server.failure is not None:  # the next version will not come (a rollback, a stop)
            raise server.failure
        if done.returncode != 0:
            raise InputError(f"{a.endpoint!r} exited with {done.returncode}; its stderr ended: "
                             f"{_tail(done.stderr)}", key="agent.endpoint")
        rewards = results(done.stdout, ids)
        return [sessions.episode(e, rewards.get(e)) for e in ids]


def _tail(text, n: int = 600) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "").strip()[-n:] or "(nothing)"
