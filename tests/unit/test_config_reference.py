"""The configuration reference (docs/configuration.md) matches the config models and names every key."""
from __future__ import annotations

import typing

from pydantic import Field

from turnstream.core.config import Config
from turnstream.core.config_fields import Section
from turnstream.reference.configuration import DOC_PATH, main, render_markdown, tables, toml_value, type_name


def test_docs_configuration_md_is_up_to_date():
    assert DOC_PATH.exists(), "run: python -m turnstream.reference.configuration --write"
    assert DOC_PATH.read_text() == render_markdown(), (
        "docs/configuration.md differs from the config models; run: "
        "python -m turnstream.reference.configuration --write")


def _leaf_keys(section: Section, path: str = "") -> set[str]:
    """Every dotted key of a default config, found independently of the generator: by walking the values."""
    out = set()
    for name in type(section).model_fields:
        value, dotted = getattr(section, name), f"{path}.{name}" if path else name
        out |= _leaf_keys(value, dotted) if isinstance(value, Section) else {dotted} if value is not None else set()
    return out


def test_every_key_of_the_default_config_is_documented():
    documented = {f"{t.path}.{k.name}" for t in tables() for k in t.keys}
    missing = _leaf_keys(Config()) - documented
    assert not missing, missing
    assert all(k.description for t in tables() for k in t.keys), "a key without a description"


def test_optional_tables_and_tagged_unions_are_documented():
    paths = [(t.path, t.variant) for t in tables()]
    assert ("learner.lora", "") in paths  # unset by default, documented all the same
    assert ("vllm.weight_sync", 'backend = "disk"') in paths
    assert ("vllm.weight_sync", 'backend = "nccl"') in paths
    text = render_markdown()
    assert "| `master_port` | int, >= 1, <= 65535 | required |" in text


def test_types_defaults_and_rules_read_as_toml():
    assert type_name(typing.Literal["auto", True, False]) == '"auto" \\| true \\| false'
    assert type_name(typing.Annotated[int, Field(ge=0, le=65535)]) == "int, >= 0, <= 65535"
    assert type_name(list[typing.Annotated[str, Field(pattern="^x")]]) == "list of str, matching `^x`"
    assert type_name(dict[str, typing.Any]) == "table"
    assert toml_value({"learner": "never"}) == '{learner = "never"}'
    assert toml_value([1, True, "a"]) == '[1, true, "a"]'
    buffer = next(t for t in tables() if t.path == "buffer")
    # the value the file had is left out of a rule's message, the rule itself is not
    assert "`buffer.max_staleness`: must be >= eta, or admitted episodes would be dropped as stale" in buffer.rules
    assert "## Rules between tables" in render_markdown()


def test_check_flag_reports_a_stale_file(tmp_path, monkeypatch, capsys):
    import turnstream.reference.configuration as ref

    stale = tmp_path / "configuration.md"
    stale.write_text("# old\n")
    monkeypatch.setattr(ref, "DOC_PATH", stale)
    assert main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert main(["--write"]) == 0 and main(["--check"]) == 0
