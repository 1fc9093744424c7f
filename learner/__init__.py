"""Learner role: advantages, off-policy-corrected PPO, weight pushes into running vLLM servers."""
