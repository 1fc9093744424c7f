"""turnstream.core.config / configtools / preflight / cli: strict loading, one-line errors naming the field,
`turnstream check`, the model.path check, light CLI imports."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from turnstream.actors.environment import Environment, register

from turnstream.core.config import (TINY_MODEL_PATH, BufferSection, Config, ConfigError, LearnerSection, SpoSection,
                                    load_config)
from turnstream.checks.preflight import ensure_model, preflight
from turnstream.core.config_fields import Section
from turnstream.core.configtools import dump_toml, from_dict

REPO = Path(__file__).resolve().parents[2]


def config_error(overrides=None, path=None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert "\n" not in message and message.strip() == message, f"not one line: {message!r}"
    return message


# ---- loading -----------------------------------------------------------------------------------------

def test_defaults_load_and_pass_the_preflight():
    cfg = load_config()
    assert cfg == Config()
    assert preflight(cfg) is cfg
    assert cfg.buffer.max_staleness >= cfg.buffer.eta
    assert cfg.learner.spo == SpoSection()


def test_spo_defaults_are_pinned():
    """The live SPO defaults: every spo run learns with them, so changing one must be deliberate."""
    assert LearnerSection().spo.model_dump() == {
        "rho_min": 0.875, "rho_max": 0.96, "d_half": 0.06, "normalize": "token", "sampling_epsilon": 0.05,
        "drift": "proximal"}


def test_every_field_has_a_description():
    def leaves(model, prefix):
        for name, field in model.model_fields.items():
            if isinstance(field.annotation, type) and issubclass(field.annotation, Section):
                yield from leaves(field.annotation, f"{prefix}{name}.")
            else:
                yield prefix + name, field

    assert not [name for name, field in leaves(Config, "") if not field.description]


def test_empty_file_gives_defaults(tmp_path):
    p = tmp_path / "empty.toml"
    p.write_text("")
    assert load_config(p) == Config()


def test_override_integer():
    cfg = load_config(None, ["buffer.eta=0"])
    assert cfg.buffer.eta == 0
    assert cfg.buffer == BufferSection(eta=0)


def test_overrides_of_every_kind():
    cfg = load_config(None, [
        "learner.lr=1e-4", "learner.max_grad_norm=2", "learner.spo.normalize=sequence", 'run.name="my run"',
        "vllm.urls=['http://h:1', 'http://h:2']", "learner.resume=false", "env.args.size=7", "env.name=test_free_args",
        "run.run_dir=runs/x",
    ])
    assert cfg.learner.lr == 1e-4
    assert cfg.learner.max_grad_norm == 2.0 and isinstance(cfg.learner.max_grad_norm, float)
    assert cfg.learner.spo.normalize == "sequence"  # a bare word is taken as a string
    assert cfg.run.name == "my run"
    assert cfg.vllm.urls == ["http://h:1", "http://h:2"]
    assert cfg.learner.resume is False
    assert cfg.env.args == {"size": 7}
    assert cfg.run.run_dir == "runs/x" and cfg.run_dir == Path("runs/x")


def test_overrides_apply_on_top_of_the_file_in_order(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[buffer]\neta = 1\nbatch_episodes = 4\nmax_items = 16\n")
    cfg = load_config(p, ["buffer.eta=3", "buffer.eta=0"])
    assert (cfg.buffer.eta, cfg.buffer.batch_episodes, cfg.buffer.max_items) == (0, 4, 16)


BAD = [
    (["buffer.max_staleness=1"], "buffer.max_staleness"),  # below eta = 2
    (["buffer.eta=0", "buffer.max_staleness=-1"], "buffer.max_staleness"),
    (["buffer.eta=-1"], "buffer.eta"),
    (["buffer.eta=1.5"], "buffer.eta"),
    (['buffer.eta="2"'], "buffer.eta"),
    (["buffer.eta=true"], "buffer.eta"),
    (["buffer.max_items=4"], "buffer.max_items"),
    (["buffer.batch_episodes=0"], "buffer.batch_episodes"),
    (["buffer.ingest_reserve_bytes=0"], "buffer.ingest_reserve_bytes"),  # removed with the warm heap
    (["buffer.nope=1"], "buffer.nope"),
    (["buffer=3"], "buffer"),
    (["nope.x=1"], "nope"),
    (["learner.lr=0"], "learner.lr"),
    (["learner.lr=-0.1"], "learner.lr"),
    (["learner.lr=abc"], "learner.lr"),
    (["learner.lr=nan"], "learner.lr"),
    (["learner.lr=[1]"], "learner.lr"),
    (["learner.clip_low=1.0"], "learner.clip_low"),
    (["learner.behaviour_weight_cap=0.5"], "learner.behaviour_weight_cap"),
    (["learner.spo.normalize=tokens"], "learner.spo.normalize"),
    (["learner.spo.nope=1"], "learner.spo.nope"),
    (["learner.estimator=ppo"], "learner.estimator"),
    (["learner.critic.whiten=microbatch", "learner.epochs=2"], "learner.critic.whiten"),
    (['learner.entropy_weight="outcome_variance"', 'learner.estimator="grpo"'], "learner.entropy_weight"),
    (["network.buffer_ingest_port=70000"], "network.buffer_ingest_port"),
    (["actor.temperature=0"], "actor.temperature"),
    (["vllm.urls=[1]"], "vllm.urls[0]"),
    (['vllm.urls="http://h:1"'], "vllm.urls"),
    (["run.target_success=1.5"], "run.target_success"),
    (["learner.resume=1"], "learner.resume"),
    (["env.args=3"], "env.args"),
    (["learner.spo.rho_min=0.99"], "learner.spo.rho_min"),  # above rho_max
    (["learner.device=tpu"], "learner.device"),
    (["learner.cpus=[-1]"], "learner.cpus"),
    (["vllm.num_servers=0"], "vllm.num_servers"),
    (["vllm.dtype=float8"], "vllm.dtype"),
    (["vllm.weight_sync=\"nccl\""], "vllm.weight_sync"),  # a table now
    (["vllm.weight_sync.backend=nccl"], "vllm.weight_sync.master_address"),
    (["vllm.weight_sync.backend=nccl", "vllm.weight_sync.master_address='h'", "vllm.weight_sync.master_port=0"],
     "vllm.weight_sync.master_port"),
    (["vllm.weight_sync.backend=disk", "vllm.weight_sync.master_port=29600"], "vllm.weight_sync.master_port"),
    (["vllm.weight_sync.backend=pigeon"], "vllm.weight_sync"),
    (["vllm.weight_sync.master_port=29600"], "vllm.weight_sync"),  # no backend
    (["vllm.nccl_master_port=29600"], "vllm.nccl_master_port"),  # the old flat field
]


@pytest.mark.parametrize("overrides,field", BAD, ids=[o[-1] for o, _ in BAD])
def test_bad_value_is_a_one_line_error_naming_the_field(overrides, field):
    message = config_error(overrides)
    assert message.startswith(f"{field}: "), message


def test_bad_value_in_a_file_names_the_field(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[learner]\nlr = -1.0\n\n[learner.spo]\nrho_min = 0.5\n")
    assert config_error(path=p).startswith("learner.lr: ")


def test_unknown_field_lists_the_known_ones():
    message = config_error(["buffer.nope=1"])
    assert "eta" in message and "max_staleness" in message


def test_override_without_equals_sign():
    message = config_error(["buffer.eta"])
    assert "buffer.eta" in message


def test_override_into_a_scalar():
    message = config_error(["buffer.eta=1", "buffer.eta.x=2"])
    assert "buffer.eta.x=2" in message


def test_missing_file(tmp_path):
    message = config_error(path=tmp_path / "absent.toml")
    assert "absent.toml" in message


def test_invalid_toml(tmp_path):
    p = tmp_path / "broken.toml"
    p.write_text("[buffer]\neta = = 2\n")
    assert "broken.toml" in config_error(path=p)


def test_from_dict_requires_a_table():
    with pytest.raises(ConfigError, match=r"^config: expected a table"):
        from_dict(Config, [1, 2])


def test_literal_fields():
    assert from_dict(LearnerSection, {"spo": {"normalize": "sequence"}}, "learner").spo.normalize == "sequence"


def test_a_section_alone_names_its_fields_under_the_given_path():
    with pytest.raises(ConfigError, match=r"^learner\.spo\.normalize: "):
        from_dict(LearnerSection, {"spo": {"normalize": "tokens"}}, "learner")


@pytest.mark.parametrize("value", ['"auto"', "true", "false"])
def test_auto_or_boolean_fields(value):
    cfg = load_config(None, [f"learner.pack_sequences={value}", f"learner.overlap_push={value}"])
    assert cfg.learner.pack_sequences == cfg.learner.overlap_push == tomllib.loads(f"v = {value}")["v"]


def test_weight_sync_is_a_table_tagged_by_backend():
    assert load_config().vllm.weight_sync.backend == "disk"
    cfg = load_config(None, ["vllm.weight_sync.backend=nccl", "vllm.weight_sync.master_address='10.0.0.1'",
                             "vllm.weight_sync.master_port=29600"])
    ws = cfg.vllm.weight_sync
    assert (ws.backend, ws.master_address, ws.master_port) == ("nccl", "10.0.0.1", 29600)
    assert "[vllm.weight_sync]\nbackend = \"nccl\"" in cfg.dumps()
    assert from_dict(Config, tomllib.loads(cfg.dumps())) == cfg


# ---- dump_toml -------------------------------------------------------------------------------------

def test_default_config_dump_reloads_equal():
    cfg = Config()
    text = cfg.dumps()
    assert text == dump_toml(cfg.model_dump(exclude_none=True))  # unset optional tables (learner.lora) left out
    assert from_dict(Config, tomllib.loads(text)) == cfg


def test_non_default_config_dump_reloads_equal():
    cfg = load_config(None, [
        'run.name="quote \\" backslash \\\\ tab\\t é"', "learner.lr=1e-6", "run.time_limit_s=inf",
        "vllm.urls=['http://a:1', 'http://b:2']", "vllm.extra_args=['--x', '--y=1']", "buffer.eta=0",
        "learner.spo.normalize=sequence", "env.args.size=5", "env.args.walls=[[1, 2], [3, 4]]",
        "env.args.reward.goal=1.0", "env.args.reward.step=-0.01", "network.max_message_bytes=1024", "env.name=test_free_args",
    ])
    again = from_dict(Config, tomllib.loads(cfg.dumps()))
    assert again == cfg
    assert again.env.args == {"size": 5, "walls": [[1, 2], [3, 4]], "reward": {"goal": 1.0, "step": -0.01}}


def test_dump_of_a_string_with_a_newline_reloads_equal():
    """run.name (or any string) holding a newline must be escaped, or the resolved config is unreadable."""
    cfg = Config()
    cfg.run.name = "line one\nline two"
    assert from_dict(Config, tomllib.loads(cfg.dumps())) == cfg


@pytest.mark.parametrize("key", ["grid size", "a.b", "x=y"])
def test_dump_of_env_args_with_keys_that_need_quoting_reloads_equal(key):
    """env.args is a free-form table; TOML allows any key when quoted, so the dump must quote such keys."""
    cfg = Config()
    cfg.env.name = "test_free_args"
    cfg.env.args = {key: 5}
    assert from_dict(Config, tomllib.loads(cfg.dumps())) == cfg


# ---- CLI -------------------------------------------------------------------------------------------

def run_cli(*args: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *flags, "-m", "turnstream.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_cli_config_error_exits_2_with_one_line(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[buffer]\neta = 0\nmax_staleness = -1\n")
    proc = run_cli("buffer", "--config", str(p))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "buffer.max_staleness" in lines[0]
    assert proc.stdout == ""


def test_cli_bad_override_exits_2_with_one_line(tmp_path):
    p = tmp_path / "ok.toml"
    p.write_text("[buffer]\neta = 1\n")
    proc = run_cli("learner", "--config", str(p), "--set", "learner.nope=3")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "learner.nope" in lines[0], proc.stderr


def test_cli_unknown_field_in_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[actor]\ntemprature = 0.5\n")
    proc = run_cli("actor", "--config", str(p))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "actor.temprature" in lines[0], proc.stderr


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The CLI's config error: exit status 2, nothing on stdout, one line on stderr (returned)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("turnstream: config error: "), proc.stderr
    assert proc.stdout == ""
    return lines[0]


def test_check_prints_the_resolved_config(tmp_path):
    p = tmp_path / "ok.toml"
    p.write_text("[buffer]\neta = 1\n")
    proc = run_cli("check", "--config", str(p), "--set", "learner.lr=1e-4")
    assert proc.returncode == 0, proc.stderr
    assert from_dict(Config, tomllib.loads(proc.stdout)) == load_config(p, ["learner.lr=1e-4"])


@pytest.mark.parametrize("override, field", [("buffer.eta=1.5", "buffer.eta"),  # loading
                                             ("env.name=nope", "env.name"),  # pre-flight: needs the registry
                                             ("buffer.error_buffer=2", "buffer.error_buffer"),  # ... the limiter
                                             ("network.curve=on", "network.keys_dir")])  # ... the keys
def test_check_reports_a_bad_config_in_one_line(tmp_path, override, field):
    p = tmp_path / "c.toml"
    p.write_text("")
    assert f"config error: {field}: " in one_line_error(run_cli("check", "--config", str(p), "--set", override))


@pytest.mark.parametrize("command", [("check",), ("up",), ("demo",)])
def test_a_missing_model_is_one_line_saying_what_to_run(tmp_path, command):
    """A command that would start vLLM on a missing checkpoint fails before starting anything (vLLM would take
    the path for a Hugging Face hub id and die in a traceback)."""
    missing, config = tmp_path / "no-model", tmp_path / "c.toml"
    config.write_text(f'[run]\nrun_dir = "{tmp_path / "run"}"\n\n[model]\npath = "{missing}"\n')
    proc = run_cli(*command, "--config", str(config))
    line = one_line_error(proc)
    assert f"model.path: {missing} holds no checkpoint" in line and f"turnstream make-tiny-model {missing}" in line
    assert not (tmp_path / "run").exists()


def test_bench_actors_with_a_missing_model_is_one_line(tmp_path):
    missing = tmp_path / "no-model"
    line = one_line_error(run_cli("bench", "actors", "--model", str(missing), "--out", str(tmp_path / "out")))
    assert f"turnstream make-tiny-model {missing}" in line and not (tmp_path / "out").exists()


def test_the_default_model_path_gets_the_tiny_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ensure_model(TINY_MODEL_PATH) == TINY_MODEL_PATH
    assert (tmp_path / TINY_MODEL_PATH / "config.json").is_file()
    with pytest.raises(ConfigError, match=r"^model\.path: elsewhere holds no checkpoint"):
        ensure_model("elsewhere")


def imported_modules(importtime_stderr: str) -> set[str]:
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.mark.parametrize("args", [("--help",), ("buffer", "--help"), ("learner", "--help"), ("demo", "--help")])
def test_cli_help_imports_neither_torch_nor_vllm(args):
    proc = run_cli(*args, flags=("-X", "importtime"))
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout
    modules = imported_modules(proc.stderr)
    assert "argparse" in modules  # the import trace was captured
    heavy = {m for m in modules if m.split(".")[0] in ("torch", "vllm", "transformers")}
    assert not heavy, sorted(heavy)[:5]


def test_build_parser_imports_neither_torch_nor_vllm():
    code = ("import sys, turnstream.cli; turnstream.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# An environment that takes any constructor arguments, so tests can exercise free-form env.args.
@register("test_free_args")
class _FreeArgs(Environment):
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def test_unknown_environment_or_bad_env_args_fail_the_preflight_naming_the_field():
    cfg = load_config(None, ["env.name=nope"])  # loading alone cannot know the environments (core imports no role)
    with pytest.raises(ConfigError, match=r"^env\.name: unknown environment 'nope'"):
        preflight(cfg)
    with pytest.raises(ConfigError, match=r"^env\.args: .*bogus"):
        preflight(load_config(None, ["env.args.bogus=1"]))


def test_network_bind_and_connect_hosts_fall_back_to_host():
    net = load_config(None, ["network.host=127.0.0.2"]).network
    assert (net.listen_host, net.buffer_address, net.learner_address) == ("127.0.0.2",) * 3
    net = load_config(None, ["network.bind_host=127.0.0.1", "network.buffer_host=localhost",
                             "network.learner_host=127.0.0.3"]).network
    assert (net.listen_host, net.buffer_address, net.learner_address) == ("127.0.0.1", "localhost", "127.0.0.3")
    assert not net.curve_enabled  # every address stays on this machine
