"""Reinforcement learning: rewards, rollouts, and the GRPO and PPO recipes' building blocks."""
