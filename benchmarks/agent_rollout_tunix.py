"""Multi-turn episodes with Tunix's agentic rollout (run with the Tunix venv, see _venvs.py): the
Tunix side of `agent_rollout.py --tunix`.

The task is agent_rollout.py's (_agent_task.py): SmolLM2-135M-Instruct, --batch episodes, each
--turns model turns of exactly --turn-tokens sampled tokens (no end token), FOLLOW_UP as the user
message between turns, temperature 1.0.

What runs is Tunix's own loop, as its agentic learners (tunix.rl.agentic) drive it:
- `RolloutOrchestrator` with `TrajectoryCollectEngine` (collect mode "Token", as the learners
  use) runs every episode as an asyncio task, up to max_concurrency (= --batch) at once; each
  engine loop is reset, then per turn model_call -> agent.update_from_model -> env.step ->
  agent.update_from_env, with the env's new messages tokenized through the chat parser;
- model_call is `AgenticRLLearner._model_call` itself (bound to a namespace holding the four
  attributes it reads, since building a whole GRPO learner needs num_generations > 1): it renders
  the whole conversation with the chat parser and calls `RLCluster.generate` with that one prompt,
  which runs the "vanilla" rollout engine (tunix.generate.sampler.Sampler);
- the agent is Tunix's `ModelAgent`; the environment is a `BaseTaskEnv` subclass (KeepGoing).

Settings that are not Tunix's defaults, and why:
- the weights are SmolLM2-135M-Instruct's as hone reads them (--weights: a folder hone.save_hf
  wrote; agent_rollout.py writes it), loaded with tunix.models.llama3.params, fp32;
- the system prompt is SmolLM2's default one, so the opening is the same text hone's episodes
  start from (checked below against the tokenizer's own chat template); the chat parser is
  Tunix's QwenChatTemplateParser, which renders ChatML, SmolLM2's format;
- the engine gets max_response_length=None: with a number, Tunix caps the sum of model and
  environment tokens of an episode and passes what is left as each turn's generation budget, so
  with no end token the first turn would take it all. With None each turn samples
  RolloutConfig.max_tokens_to_generate (= --turn-tokens) tokens;
- RolloutConfig: temperature 1.0, top_p 1.0 (Tunix's sampler draws with temperature only in its
  top-p mode), EOS an id no token has, return_logprobs=True (the agentic learners require it),
  max_prompt_length 64 (the default: prompts pad to the next power of two at or above it),
  kv_cache_size --cache-size (default: the last turn's padded prompt plus one turn; 288 for
  3 turns of 32 tokens).

Timed: one whole batch of episodes (orchestrator start to the last trajectory) after one
compiling batch, median of --repeats. Prints one JSON line: seconds, model tokens per second, and
the mean prompt length (tokens the sampler prefilled) at each turn.

    benchmarks/.venvs/tunix/bin/python benchmarks/agent_rollout_tunix.py --weights DIR
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import types
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import transformers
from jax.sharding import AxisType, Mesh
from tunix.models.llama3 import params as llama3_params
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.agentic import agentic_rl_learner
from tunix.rl.agentic import utils as agentic_utils
from tunix.rl.agentic.agents import model_agent
from tunix.rl.agentic.environments import base_environment
from tunix.rl.agentic.parser.chat_template_parser import parser as parser_lib
from tunix.rl.agentic.pipeline import rollout_orchestrator
from tunix.rl.agentic.trajectory import trajectory_collect_engine
from tunix.rl.rollout import base_rollout

from _agent_task import FOLLOW_UP, question
from _measure import first_and_median, peak_rss_mb
from _tunix_model import NO_EOS, adamw, smollm2_135m_config

# SmolLM2-Instruct's chat template adds this system message when a conversation has none;
# Tunix's agents always send one, so it is given here to keep the opening the same text.
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


class KeepGoing(base_environment.BaseTaskEnv):
    """The environment of agent_rollout.py's KeepGoing: the question opens the episode, every
    reply is answered with FOLLOW_UP, and the episode ends after `turns` replies."""

    def __init__(self, task, *, turns: int, **kwargs):
        super().__init__(task=task, max_steps=turns, **kwargs)

    def _initial_observation(self):
        return {"prompts": self.task["prompts"]}  # ConversationAgentBase: one user message

    def _step_impl(self, action) -> base_environment.EnvStepResult:
        return base_environment.EnvStepResult(
            observation=FOLLOW_UP, reward=0.0, done=self.step_count >= self.max_steps, info={})


def longest_prompt(turns: int, turn_tokens: int) -> int:
    """The padded length of the last turn's prompt: the opening (under 64 tokens), then per
    earlier turn its reply and FOLLOW_UP with the chat markup (under 32 tokens), rounded up to
    the power of two the sampler pads to (the sampler stops with an error if it is short)."""
    longest = 64 + (turns - 1) * (turn_tokens + 32)
    return 1 << (longest - 1).bit_length()


def build_cluster(weights: str, args) -> rl_cluster_lib.RLCluster:
    """An RLCluster whose rollout (vanilla engine) samples from the SmolLM2 weights."""
    # jax.make_mesh would default to Explicit axes; Tunix's models expect Auto.
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"),
                axis_types=(AxisType.Auto, AxisType.Auto))
    model = llama3_params.create_model_from_safe_tensors(weights, smollm2_135m_config(), mesh)
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=args.turn_tokens, max_prompt_length=64,
        kv_cache_size=args.cache_size, temperature=1.0, top_p=1.0, eos_tokens=[NO_EOS],
        return_logprobs=True)
    training = rl_cluster_lib.RLTrainingConfig(actor_optimizer=adamw(),
                                               eval_every_n_steps=10**9, max_steps=1)
    return rl_cluster_lib.RLCluster(
        actor=model, tokenizer=transformers.AutoTokenizer.from_pretrained(weights),
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={role: mesh for role in (rl_cluster_lib.Role.ACTOR,
                                                  rl_cluster_lib.Role.REFERENCE,
                                                  rl_cluster_lib.Role.ROLLOUT)},
            rollout_engine="vanilla", offload_to_cpu=False, training_config=training,
            rollout_config=rollout))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", required=True, help="a folder hone.save_hf wrote (SmolLM2)")
    for name, default in (("batch", 8), ("turns", 3), ("turn-tokens", 32), ("repeats", 3),
                          ("cache-size", 0)):
        ap.add_argument("--" + name, type=int, default=default)
    args = ap.parse_args()
    if not args.cache_size:  # room for the last turn's prompt, padded, and its reply
        args.cache_size = longest_prompt(args.turns, args.turn_tokens) + args.turn_tokens

    cluster = build_cluster(args.weights, args)
    tokenizer = cluster.tokenizer  # Tunix's TokenizerAdapter around the HF tokenizer
    chat_parser = parser_lib.QwenChatTemplateParser(tokenizer)
    opening = [{"role": "system", "content": SMOLLM2_SYSTEM},
               {"role": "user", "content": question(0)}]
    assert (chat_parser.parse(opening, add_generation_prompt=True, is_first_msg=True)
            == tokenizer.apply_chat_template(opening[1:], add_generation_prompt=True,
                                             tokenize=False)), "the opening differs from hone's"

    learner_attrs = types.SimpleNamespace(policy_version=0, chat_parser=chat_parser,
                                          _full_batch_size=0, rl_cluster=cluster)
    model_call = functools.partial(agentic_rl_learner.AgenticRLLearner._model_call,
                                   learner_attrs)
    engine_kwargs = dict(model_call=model_call, tokenizer=tokenizer, chat_parser=chat_parser,
                         timeout=3600.0, max_response_length=None)
    loop = asyncio.new_event_loop()
    # As AgenticRLLearner does: one executor thread per concurrent episode, plus one.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=args.batch + 1))

    async def batch_of_episodes() -> list:
        orchestrator = rollout_orchestrator.RolloutOrchestrator(
            rollout_sync_lock=agentic_utils.RolloutSyncLock(),
            engine_cls=trajectory_collect_engine.TrajectoryCollectEngine,
            engine_kwargs=engine_kwargs, max_concurrency=args.batch)
        pairs = [(model_agent.ModelAgent(system_prompt=SMOLLM2_SYSTEM),
                  KeepGoing({"prompts": question(i)}, turns=args.turns, group_id=i,
                            pair_index=0)) for i in range(args.batch)]
        producer = asyncio.create_task(orchestrator.run_producers_from_stream(
            pairs, group_size=1, collect_mode="Token",
            group_key_fn=lambda i, env, traj: env.extra_kwargs["group_id"]))
        await asyncio.sleep(0)  # as the learner does: the producer sets up its queue first
        items = [item async for group in orchestrator.yield_batches(batch_size=1)
                 for item in group]
        await producer
        return [item.traj for item in items]

    def check(trajs: list) -> list[float]:
        """Every episode ran all turns at full length; returns the mean prompt length per turn
        (the tokens the sampler prefilled: the whole conversation so far)."""
        assert len(trajs) == args.batch, len(trajs)
        for t in trajs:
            assert t["status"] == "SUCCEEDED", t["status"]
            assert int(np.sum(t["conversation_masks"])) == args.turns * args.turn_tokens, (
                int(np.sum(t["conversation_masks"])))
        lengths = [[] for _ in range(args.turns)]
        for t in trajs:
            messages = t["conversation_text"]
            assistant = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
            for turn, k in enumerate(assistant):
                text = chat_parser.parse(messages[:k], add_generation_prompt=True,
                                         is_first_msg=True)
                lengths[turn].append(len(tokenizer.encode(text)))
        return [statistics.mean(x) for x in lengths]

    first, median, prompt_lengths = first_and_median(
        lambda: loop.run_until_complete(batch_of_episodes()), args.repeats, value=check)
    sampled = args.batch * args.turns * args.turn_tokens
    print(json.dumps({
        "impl": "tunix", "row": "agent-episodes", "batch": args.batch, "turns": args.turns,
        "turn_tokens": args.turn_tokens, "first_s": first, "seconds": median,
        "tokens_per_s": sampled / median, "prompt_tokens_by_turn": prompt_lengths,
        "peak_rss_mb": peak_rss_mb()}), flush=True)


if __name__ == "__main__":
    main()
