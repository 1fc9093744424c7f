"""Pre-flight: the config checks that need role code or the file system, run before anything starts.

Loading a config (turnstream.core.config) checks types, bounds and the rules between fields; what it cannot
know without the roles' code (is there an environment of that name, does its turn fit in the buffer's episode
timeout, can the rate limiter deadlock, are the CURVE keys there) is checked here, by `turnstream check` and every
command that starts a role. Each failure is a ConfigError: one line naming the field, exit status 2 from the CLI.
"""
from __future__ import annotations

import logging
from pathlib import Path

from turnstream.core.config import TINY_MODEL_PATH, Config
from turnstream.core.configtools import ConfigError

log = logging.getLogger("turnstream.checks.preflight")


def preflight(cfg: Config) -> Config:
    """Raise ConfigError for the first problem; return `cfg` unchanged."""
    env = _check_env(cfg)
    _check_task_order(cfg, env)
    _check_turn_fits_episode_timeout(cfg, env)
    _check_rate_limiter(cfg)
    _check_curve_keys(cfg)
    return cfg


def _check_env(cfg: Config):
    """The run's environment, built once: the name and arguments are right if it builds."""
    from turnstream.actors.play.player import EpisodePlayer
    from turnstream.actors.envs.registry import known_envs, make_env, resolve

    if cfg.env.name not in known_envs():
        raise ConfigError(f"env.name: unknown environment {cfg.env.name!r}; known: {', '.join(known_envs())}")
    factory = resolve(cfg.env.name)
    if isinstance(factory, type) and issubclass(factory, EpisodePlayer):  # agent, verifiers: their own isolation
        factory.check_isolation(cfg.env.isolation, cfg.env.name)
    try:
        return make_env(cfg.env.name, **cfg.env.args)
    except ConfigError:
        raise  # an adapter's own message already names the field
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"env.args: {exc}") from None


def _check_task_order(cfg: Config, env) -> None:
    """The order the actors will build (a sequential one, or one with tasks held out for evaluation, needs an
    environment that enumerates its tasks)."""
    from turnstream.actors.tasks.orders import make_order

    make_order(cfg.tasks.order, env_factory=lambda: env, actor_seed=0, run_seed=cfg.run.seed,
               epochs=cfg.tasks.epochs, eval_split=cfg.tasks.eval_split)


def _check_turn_fits_episode_timeout(cfg: Config, env) -> None:
    """The buffer abandons an episode that sent no chunk for buffer.episode_timeout_s (buffer/store/replay_store.py,
    `expire`: measured from its last chunk) and rejects its later chunks. Between two chunks of one seat the actor
    plays a turn of every seat in order (actors/play/env_loop.py): a generate request, which may take up to its
    deadline, actor.request_timeout_s, retries and pauses included (actors/inference/fleet.py), then a step, up to
    the environment's own limit or else env.step_timeout_s (actors/envs/guard/settings.py)."""
    from turnstream.actors.envs.guard.settings import GuardSettings
    from turnstream.actors.play.player import EpisodePlayer

    if isinstance(env, EpisodePlayer):  # agent, verifiers: one stream, held to the run's limits (actors/play/)
        step_s, step, seats = cfg.env.step_timeout_s, "env.step_timeout_s", 1
    else:
        step_s = GuardSettings.from_config(cfg.env).step_limit(env)
        step = "env.step_timeout_s" if env.step_timeout_s is None else "the environment's own step_timeout_s"
        seats = max(1, int(env.num_agents))
    longest = seats * (cfg.actor.request_timeout_s + step_s)
    if longest >= cfg.buffer.episode_timeout_s:
        turns = f"{seats} seats * " if seats > 1 else ""
        raise ConfigError(f"buffer.episode_timeout_s: must be more than {turns}(actor.request_timeout_s "
                          f"({cfg.actor.request_timeout_s:g} s) + {step} ({step_s:g} s)) = {longest:g} s, the longest "
                          f"a live episode of {cfg.env.name} can go without a chunk; got "
                          f"{cfg.buffer.episode_timeout_s:g} s, which would abandon it")


def _check_rate_limiter(cfg: Config) -> None:
    from turnstream.buffer.store.ratelimit import limiter_problem

    b = cfg.buffer
    field, reason = limiter_problem(b.samples_per_insert, b.min_size_to_sample, b.error_buffer or float("inf"),
                                    batch_episodes=b.batch_episodes, max_items=b.max_items, eta=b.eta)
    if field:
        raise ConfigError(f"buffer.{field}: {reason}")


def _check_curve_keys(cfg: Config) -> None:
    from turnstream.protocol.auth import keys_for

    keys_for(cfg.network)  # loads the client's keys when CURVE is on, or says which file is missing


def served_models(cfg: Config) -> list[tuple[str, str]]:
    """(path, field) of every checkpoint the launcher starts vLLM on."""
    models = [(cfg.model.path, "model.path")]
    if cfg.actor.frozen_agents and not cfg.vllm.frozen_urls and cfg.model.frozen_path:
        models.append((cfg.model.frozen_path, "model.frozen_path"))
    return models


def check_models(cfg: Config) -> None:
    """`turnstream check`: what ensure_models would refuse, without building anything."""
    for path, field in served_models(cfg):
        problem = _model_problem(path, field)
        if problem:
            raise ConfigError(problem)


def ensure_models(cfg: Config) -> None:
    for path, field in served_models(cfg):
        ensure_model(path, field, cfg.model.tiny_seed)


def ensure_model(path: str, field: str = "model.path", tiny_seed: int = 0) -> str:
    """Before vLLM starts: `path` holds a checkpoint, or the tiny model is built where the default names it
    (vLLM would take a missing directory for a Hugging Face hub id and die in a traceback), or a ConfigError
    says what to run. Returns `path`."""
    problem = _model_problem(path, field)
    if problem:
        raise ConfigError(problem)
    if not _holds_checkpoint(path):
        from turnstream.tiny_model import make_tiny_model

        log.info("building the tiny model into %s", path)
        make_tiny_model(path, seed=tiny_seed)
    return path


def _model_problem(path: str, field: str) -> str:
    if _holds_checkpoint(path) or Path(path).resolve() == Path(TINY_MODEL_PATH).resolve():
        return ""
    from turnstream.models.catalog import MODELS

    name = Path(path).name
    if name in MODELS:  # the folder `turnstream models get NAME` writes by default
        return f"{field}: {path} holds no checkpoint (config.json); write it with `turnstream models get {name}`"
    return (f"{field}: {path} holds no checkpoint (config.json); point it at a Hugging Face checkpoint directory, "
            f"or build the tiny model there with `turnstream make-tiny-model {path}`")


def _holds_checkpoint(path: str) -> bool:
    return (Path(path) / "config.json").is_file()
