"""turnstream: asynchronous streaming actor-learner RL for multi-turn LLM agents."""

__version__ = "0.1.0"
