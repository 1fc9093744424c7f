"""Adapters from established environment libraries (TextArena, TextWorld, reasoning-gym, Gymnasium) to
turnstream's `Environment`. Each is registered through the `turnstream.environments` entry points in
pyproject.toml and imports its library only when an environment is made, so `turnstream envs` lists every
adapter whether or not its library is installed (docs/adapters/ describes each)."""
