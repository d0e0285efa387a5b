"""The config package's shared rules: versioned kinds, camelCase keys, errors that name the key,
defaults documented from the settings dataclasses (the docs' YAML blocks are checked against
them)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Literal

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from rdmaplane.adapters.config import API_VERSION, ConfigError, Kind, load, parse, render_defaults
from rdmaplane.adapters.config.agent import AGENT_CONFIG
from rdmaplane.adapters.config.base import adapter, dataclass_in, item_type
from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG
from rdmaplane.adapters.config.extender import SCHEDULER_EXTENDER_CONFIG
from rdmaplane.adapters.config.kinds import KINDS
from rdmaplane.cli import app
from rdmaplane.core.settings import (
    Seconds,
    doc_of,
    format_duration,
    key_for,
    key_of,
    parse_duration,
    setting,
)

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


def fields_of(settings: type[object]) -> list[tuple[str, str, str]]:
    """(class, key, description) of every field, nested sections included."""
    out = []
    hints = typing.get_type_hints(settings)
    for field in dataclasses.fields(settings):  # type: ignore[arg-type]
        out.append((settings.__name__, key_of(field), doc_of(field)))
        annotation = hints[field.name]
        inner = dataclass_in(annotation) or dataclass_in(item_type(annotation))
        if inner is not None and inner is not settings:
            out += fields_of(inner)
    return out


@pytest.mark.parametrize("kind", sorted(KINDS), ids=str)
def test_every_key_is_camel_case_and_explained(kind: str) -> None:
    """Keys follow one style, and `render_defaults` (the docs) says what each one is for."""
    for model, key, description in fields_of(KINDS[kind].settings):
        assert re.fullmatch(r"[a-z][A-Za-z0-9]*", key), f"{model}.{key} is not camelCase"
        assert description, f"{model}.{key} has no description"


@pytest.mark.parametrize("kind", sorted(KINDS), ids=str)
def test_rendered_defaults_load_back_as_the_defaults(kind: str) -> None:
    k = KINDS[kind]
    doc = yaml.safe_load(render_defaults(k))
    dumped = adapter(k.settings).dump_python(k.settings(), mode="json", by_alias=True)
    assert doc == {"apiVersion": API_VERSION, "kind": kind, **dumped}
    assert parse(doc, k, "defaults") == k.settings()


def test_no_file_is_the_defaults_without_the_validator() -> None:
    """A command given no config file gets the dataclasses' own defaults, and pydantic is not
    even imported for it (start-up time: bench/cli.py)."""
    assert load(None, AGENT_CONFIG) == AGENT_CONFIG.settings()
    assert load(None, AGENT_CONFIG, node_name="n").node_name == "n"
    code = (
        "import sys; from rdmaplane.adapters.config import load; "
        "from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG as K; "
        "load(None, K); print(sorted(m for m in sys.modules if m.startswith('pydantic')))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout == "[]\n"


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
    if text.startswith(f"# {kind.name} defaults"):
        assert text == render_defaults(kind), (
            f"{where}: the {kind.name} defaults block is stale; replace it with the output "
            f"of `rdmaplane config defaults {kind.name}`:\n{render_defaults(kind)}"
        )


@pytest.mark.parametrize("kind", sorted(KINDS), ids=str)
def test_each_kind_has_its_defaults_in_its_docs(kind: str) -> None:
    k = KINDS[kind]
    blocks = BLOCK.findall((REPO / k.docs).read_text())
    assert render_defaults(k) in blocks, f"{k.docs} lacks `rdmaplane config defaults {kind}`"


UNVERSIONED = "no apiVersion/kind: add `apiVersion: {v}` and `kind: {k}` at the top (keys are "
UNVERSIONED += "camelCase; see {d})"


@pytest.mark.parametrize(
    ("content", "kind", "message"),
    [
        (
            "weights: {alignment: 1}\n",
            SCHEDULER_EXTENDER_CONFIG,
            UNVERSIONED.format(
                v=API_VERSION, k="SchedulerExtenderConfig", d=SCHEDULER_EXTENDER_CONFIG.docs
            ),
        ),
        (
            "nodeName: n\n",
            AGENT_CONFIG,
            UNVERSIONED.format(v=API_VERSION, k="AgentConfig", d=AGENT_CONFIG.docs),
        ),
        (
            f"apiVersion: {API_VERSION}\nkind: DevicePluginConfig\n",
            AGENT_CONFIG,
            "kind: 'DevicePluginConfig'; expected AgentConfig (a DevicePluginConfig is read by "
            "rdmaplane device-plugin --config, or the agent's devicePluginConfig)",
        ),
    ],
)
def test_a_file_says_what_it_lacks_or_what_reads_it(
    content: str, kind: Kind[object], message: str, tmp_path: Path
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
        load(path, AGENT_CONFIG)
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
        parse(doc, AGENT_CONFIG, "a.yaml")
    assert str(e.value) == (
        "a.yaml: metricsPort: Input should be less than or equal to 65535; "
        "health.window_s: unknown key (did you mean window?); "
        "pollIntervalSeconds: unknown key (did you mean pollInterval?)"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    burst_s: Seconds = setting(1.0, "how long a burst may last", gt=0)


@dataclasses.dataclass(frozen=True, slots=True)
class WidgetSettings:
    limits: Limits = setting(factory=Limits, doc="limits")
    mode: Literal["a", "b"] = setting("a", "a or b")


def test_a_new_kind_is_a_dataclass_and_one_line() -> None:
    """What docs/configuration.md promises: settings are a frozen dataclass of `setting`s,
    a kind is one `Kind` naming it; loading, the errors and the defaults follow."""
    widget = Kind("WidgetConfig", WidgetSettings, "docs/widget.md", "rdmaplane widget --config")
    KINDS["WidgetConfig"] = widget
    try:
        doc = {"apiVersion": API_VERSION, "kind": "WidgetConfig", "limits": {"burst": "1m30s"}}
        assert parse(doc, widget, "w.yaml") == WidgetSettings(Limits(90.0))
        with pytest.raises(
            ConfigError, match=r"limits.burstTime: unknown key \(did you mean burst"
        ):
            parse({**doc, "limits": {"burstTime": 2}}, widget, "w.yaml")
        with pytest.raises(ConfigError, match=r"limits.burst: Input should be greater than 0"):
            parse({**doc, "limits": {"burst": "0s"}}, widget, "w.yaml")
        with pytest.raises(ConfigError, match=r"a WidgetConfig is read by rdmaplane widget"):
            parse(doc, AGENT_CONFIG, "w.yaml")
        assert "  burst: 1s  # how long a burst may last\n" in render_defaults(widget)
    finally:
        del KINDS["WidgetConfig"]


runner = CliRunner()


def test_cli_defaults_prints_what_the_docs_show() -> None:
    result = runner.invoke(app, ["config", "defaults", "DevicePluginConfig"])
    assert result.exit_code == 0 and result.output == render_defaults(DEVICE_PLUGIN_CONFIG)
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
