"""Rollout actor role: play episodes against environments with vLLM and stream every turn."""
