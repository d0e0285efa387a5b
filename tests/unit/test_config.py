"""The config package's shared rules: versioned kinds, camelCase keys, errors that name the key,
defaults documented from the models (the docs' YAML blocks are checked against them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field
from typer.testing import CliRunner

from rdmaplane.cli import app
from rdmaplane.config import (
    API_VERSION,
    KINDS,
    AgentConfig,
    ConfigError,
    DevicePluginConfig,
    Kind,
    SchedulerExtenderConfig,
    Section,
    load,
    parse,
    render_defaults,
)
from rdmaplane.config.base import Seconds, format_duration, key_for, parse_duration, section_type

REPO = Path(__file__).resolve().parents[2]
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.S | re.M)


def test_the_three_kinds_are_registered() -> None:
    assert set(KINDS) >= {"AgentConfig", "DevicePluginConfig", "SchedulerExtenderConfig"}


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("node_name", "nodeName"),
        ("poll_interval_s", "pollInterval"),  # the unit is in the value: 5s
        ("metrics_address", "metricsAddress"),
        ("kubeconfig", "kubeconfig"),
    ],
)
def test_keys_are_camel_case(name: str, key: str) -> None:
    assert key_for(name) == key


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0), ("1.5s", 1.5), (7, 7)],
)
def test_durations_read_as_kubernetes_writes_them(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5", "5 s", "1m30", "soon", "-1s", "1d", ""])
def test_what_is_no_duration(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


@given(st.integers(min_value=0, max_value=10**9))
def test_durations_written_read_back(millis: int) -> None:
    text = format_duration(millis / 1000)
    assert parse_duration(text) == pytest.approx(millis / 1000)
    assert text == "0s" or not text.startswith("0")


def fields_of(model: type[Section]) -> list[tuple[str, str, object]]:
    """(model, key, description) of every field, nested sections included."""
    out = []
    for name, field in model.model_fields.items():
        out.append((model.__name__, field.alias or name, field.description))
        inner = section_type(field.annotation) or section_type(
            next(iter(getattr(field.annotation, "__args__", ())), None)
        )
        if inner is not None and inner is not model:
            out += fields_of(inner)
    return out


@pytest.mark.parametrize("kind", sorted(KINDS), ids=str)
def test_every_key_is_camel_case_and_explained(kind: str) -> None:
    """Keys follow one style, and `render_defaults` (the docs) says what each one is for."""
    for model, key, description in fields_of(KINDS[kind]):
        assert re.fullmatch(r"[a-z][A-Za-z0-9]*", key), f"{model}.{key} is not camelCase"
        assert description or key == "kind", f"{model}.{key} has no description"


@pytest.mark.parametrize("kind", sorted(KINDS), ids=str)
def test_rendered_defaults_load_back_as_the_defaults(kind: str) -> None:
    cls = KINDS[kind]
    doc = yaml.safe_load(render_defaults(cls))
    assert doc == cls().model_dump(mode="json", by_alias=True)
    assert parse(doc, cls, "defaults") == cls()


def doc_blocks() -> list[tuple[str, str]]:
    """(file, text) of every YAML block in the docs that is an rdmaplane config (other
    rdmaplane documents, such as the Fabric file, are checked by their own readers)."""
    return [
        (path.name, text)
        for path in DOCS
        for text in BLOCK.findall(path.read_text())
        if f"apiVersion: {API_VERSION}" in text and yaml.safe_load(text).get("kind") in KINDS
    ]


@pytest.mark.parametrize(("where", "text"), doc_blocks(), ids=[w for w, _ in doc_blocks()])
def test_config_blocks_in_the_docs_load(where: str, text: str) -> None:
    """Every example loads as its kind; a defaults block is exactly what the model renders."""
    kind = KINDS[yaml.safe_load(text)["kind"]]
    parse(yaml.safe_load(text), kind, where)
    if text.startswith(f"# {kind.__name__} defaults"):
        assert text == render_defaults(kind), (
            f"{where}: the {kind.__name__} defaults block is stale; replace it with the output "
            f"of `rdmaplane config defaults {kind.__name__}`:\n{render_defaults(kind)}"
        )


@pytest.mark.parametrize("kind", sorted(KINDS), ids=str)
def test_each_kind_has_its_defaults_in_its_docs(kind: str) -> None:
    cls = KINDS[kind]
    blocks = BLOCK.findall((REPO / cls.docs).read_text())
    assert render_defaults(cls) in blocks, f"{cls.docs} lacks `rdmaplane config defaults {kind}`"


UNVERSIONED = "no apiVersion/kind: add `apiVersion: {v}` and `kind: {k}` at the top (keys are "
UNVERSIONED += "camelCase; see {d})"


@pytest.mark.parametrize(
    ("content", "kind", "message"),
    [
        (
            "weights: {alignment: 1}\n",
            SchedulerExtenderConfig,
            UNVERSIONED.format(
                v=API_VERSION, k="SchedulerExtenderConfig", d=SchedulerExtenderConfig.docs
            ),
        ),
        (
            "nodeName: n\n",
            AgentConfig,
            UNVERSIONED.format(v=API_VERSION, k="AgentConfig", d=AgentConfig.docs),
        ),
        (
            f"apiVersion: {API_VERSION}\nkind: DevicePluginConfig\n",
            AgentConfig,
            "kind: 'DevicePluginConfig'; expected AgentConfig (a DevicePluginConfig is read by "
            "rdmaplane device-plugin --config, or the agent's devicePluginConfig)",
        ),
    ],
)
def test_a_file_says_what_it_lacks_or_what_reads_it(
    content: str, kind: type[Kind], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError) as e:
        load(path, kind)
    assert str(e.value) == f"{path}: {message}"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty; a config file starts with apiVersion and kind"),
        ("[]\n", "expected a mapping with apiVersion and kind, got a list"),
        ("just text\n", "expected a mapping with apiVersion and kind, got a string"),
        ("7\n", "expected a mapping with apiVersion and kind, got a number"),
        ("kind: AgentConfig\n", "apiVersion: missing; use rdmaplane.io/v1alpha1"),
        (f"apiVersion: {API_VERSION}\n", "kind: missing; expected AgentConfig"),
        (
            "apiVersion: rdmaplane.io/v1\nkind: AgentConfig\n",
            "apiVersion: 'rdmaplane.io/v1' is not",
        ),
        ("a: " + "[" * 100 + "]" * 100 + "\n", "nested deeper than 64 levels"),
    ],
)
def test_shapes_that_are_no_config(content: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError) as e:
        load(path, AgentConfig)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value)
    assert "\n" not in str(e.value)


def test_every_problem_is_named_at_once() -> None:
    doc = {
        "apiVersion": API_VERSION,
        "kind": "AgentConfig",
        "pollIntervalSeconds": 5,
        "health": {"window_s": 1},
        "metricsPort": 70000,
    }
    with pytest.raises(ConfigError) as e:
        parse(doc, AgentConfig, "a.yaml")
    assert str(e.value) == (
        "a.yaml: metricsPort: Input should be less than or equal to 65535; "
        "health.window_s: unknown key (did you mean window?); "
        "pollIntervalSeconds: unknown key (did you mean pollInterval?)"
    )


def test_a_new_kind_is_one_class() -> None:
    """What docs/configuration.md promises: a kind and a section are classes, nothing else."""

    class LimitsConfig(Section):
        burst_s: Seconds = Field(default=1.0, gt=0, description="how long a burst may last")

    class WidgetConfig(Kind):
        docs = "docs/widget.md"
        read_by = "rdmaplane widget --config"
        kind: Literal["WidgetConfig"] = "WidgetConfig"
        limits: LimitsConfig = Field(default_factory=LimitsConfig, description="limits")

    try:
        assert KINDS["WidgetConfig"] is WidgetConfig
        doc = {"apiVersion": API_VERSION, "kind": "WidgetConfig", "limits": {"burst": "1m30s"}}
        assert parse(doc, WidgetConfig, "w.yaml").limits.burst_s == 90
        with pytest.raises(
            ConfigError, match=r"limits.burstTime: unknown key \(did you mean burst"
        ):
            parse({**doc, "limits": {"burstTime": 2}}, WidgetConfig, "w.yaml")
        with pytest.raises(ConfigError, match=r"a WidgetConfig is read by rdmaplane widget"):
            parse(doc, AgentConfig, "w.yaml")
        assert "  burst: 1s  # how long a burst may last\n" in render_defaults(WidgetConfig)
    finally:
        del KINDS["WidgetConfig"]


runner = CliRunner()


def test_cli_defaults_prints_what_the_docs_show() -> None:
    result = runner.invoke(app, ["config", "defaults", "DevicePluginConfig"])
    assert result.exit_code == 0 and result.output == render_defaults(DevicePluginConfig)
    result = runner.invoke(app, ["config", "defaults", "Nonsense"])
    assert result.exit_code == 2 and "unknown kind 'Nonsense'" in result.output


def test_cli_validate_checks_each_file_by_its_kind(tmp_path: Path) -> None:
    good = REPO / "deploy" / "device-plugin" / "config-from-shared-rdma-plugin.json"
    bad = tmp_path / "agent.yaml"
    bad.write_text(f"apiVersion: {API_VERSION}\nkind: AgentConfig\npollEvery: 3\n")
    kindless = tmp_path / "kindless.yaml"
    kindless.write_text("pools: []\n")
    result = runner.invoke(app, ["config", "validate", str(good)])
    assert result.exit_code == 0 and "a valid DevicePluginConfig" in result.output
    result = runner.invoke(app, ["config", "validate", str(good), str(bad), str(kindless)])
    assert result.exit_code == 2
    assert f"error: {bad}: pollEvery: unknown key" in result.output
    assert f"error: {kindless}: kind: missing; one of AgentConfig, " in result.output
