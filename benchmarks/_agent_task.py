"""The multi-turn task that agent_rollout.py times, shared by its hone side and its Tunix side
(agent_rollout_tunix.py, which runs in the Tunix venv and cannot import hone): the opening
questions and the user message between turns. Standard library only, for the same reason.
"""

QUESTIONS = ["What is 4821 * 367?", "Plan a three-day trip to Kyoto.",
             "Explain how a heat pump works.", "Write a short story about a lighthouse.",
             "What is the derivative of x^3 sin x?", "List five facts about octopuses.",
             "How do vaccines train the immune system?", "Describe the rules of chess briefly."]

FOLLOW_UP = "Good. Now say more about it, in detail."  # the environment's turn, every time


def question(i: int) -> str:
    """The opening question of episode i (the list repeats past its end)."""
    return QUESTIONS[i % len(QUESTIONS)]
