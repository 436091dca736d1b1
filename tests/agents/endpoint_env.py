"""An environment written as an outside program, as a user of another agent framework would
write one: it reads hone's tasks on stdin, plays each episode through the `openai` client
against the served policy (two model turns: the question, then a follow-up), and prints each
episode's reward. Reward: 1 - (reply tokens of both turns) / 32, so shorter replies score higher
(the tiny model's random replies run to the 16-token turn limit)."""

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import openai

client = openai.OpenAI(base_url=os.environ["HONE_BASE_URL"], api_key=os.environ["HONE_API_KEY"],
                       max_retries=0)


def play(task):
    hone = {"hone": {"episode": task["episode"]}}
    messages = [{"role": "user", "content": task["example"]["prompt"][:60]}]
    used = 0
    for follow_up in ("Once more, shorter.", None):
        r = client.chat.completions.create(model=os.environ["HONE_MODEL"], messages=messages,
                                           max_tokens=64, extra_body=hone)
        used += r.usage.completion_tokens
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    return {"episode": task["episode"], "reward": 1.0 - used / 32}


tasks = [json.loads(line) for line in sys.stdin if line.strip()]
print(f"playing {len(tasks)} episodes")  # not a result line: ignored by hone
with ThreadPoolExecutor(4) as pool:
    for result in pool.map(play, tasks):
        print(json.dumps(result), flush=True)
