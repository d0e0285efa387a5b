"""`--config` of every command that takes one, fed hostile and careless files: exit 2, one line
naming the file (and the key when there is one), never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rdmaplane.cli import app

COMMANDS = {
    "agent": ["agent", "--node-name", "n", "--no-publish", "--config"],
    "device-plugin": ["device-plugin", "--config"],
    "scheduler-extender": ["scheduler-extender", "--config"],
    "explain-placement": ["explain-placement", "pod.yaml", "--nrt", "nrt.yaml", "--config"],
    "config validate": ["config", "validate"],
}
KIND = {
    "agent": "AgentConfig",
    "device-plugin": "DevicePluginConfig",
    "scheduler-extender": "SchedulerExtenderConfig",
    "explain-placement": "SchedulerExtenderConfig",
    "config validate": "SchedulerExtenderConfig",
}
HOSTILE: dict[str, bytes] = {
    "binary junk": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe",
    "not UTF-8": "nodeName: caf\xe9\n".encode("latin-1"),
    "deep nesting": b"a: " + b"[" * 1000 + b"]" * 1000 + b"\n",
    "deep JSON": b'{"a": ' + b'{"b": ' * 3000 + b"1" + b"}" * 3001,
    "a list": b"[]\n",
    "empty": b"",
    "bad YAML": b"apiVersion: [\n",
}
EXPECTED = {
    "binary junk": "not UTF-8 text",
    "not UTF-8": "not UTF-8 text",
    "deep nesting": "nested deeper than 64 levels",
    "deep JSON": "nested deeper than 64 levels",
    "a list": "expected a mapping with apiVersion and kind, got a list",
    "empty": "empty; a config file starts with apiVersion and kind",
    "bad YAML": "not valid YAML/JSON",
}

runner = CliRunner()


def run(command: str, path: Path) -> tuple[int, str]:
    result = runner.invoke(app, [*COMMANDS[command], str(path)])
    return result.exit_code, result.output


def assert_one_line(output: str, *parts: str) -> None:
    assert "Traceback" not in output
    lines = output.splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("error: ")
    for part in parts:
        assert part in lines[0], output


@pytest.mark.parametrize("content", sorted(HOSTILE))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_hostile_config_files(command: str, content: str, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(HOSTILE[content])
    code, output = run(command, path)
    assert code == 2, output
    assert_one_line(output, str(path), EXPECTED[content])


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_folder_or_nothing_at_the_path(command: str, tmp_path: Path) -> None:
    for path, said in ((tmp_path, "is a directory"), (tmp_path / "nope.yaml", "cannot read")):
        code, output = run(command, path)
        assert code == 2, output
        assert_one_line(output, str(path), said)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unversioned_file_says_what_to_add(command: str, tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text("someKey: 1\n")
    code, output = run(command, path)
    assert code == 2, output
    if command == "config validate":
        assert_one_line(output, str(path), "kind: missing; one of AgentConfig,")
    else:
        assert_one_line(output, str(path), f"`kind: {KIND[command]}` at the top")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_unknown_keys_and_bad_values_name_the_key(command: str, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    head = f"apiVersion: rdmaplane.io/v1alpha1\nkind: {KIND[command]}\n"
    path.write_text(head + "surpriseKey: 1\n")
    code, output = run(command, path)
    assert code == 2
    assert_one_line(output, f"{path}: surpriseKey: unknown key")
    bad_value = {
        "AgentConfig": "metricsAddress: not an ip\n",
        "DevicePluginConfig": "pools: [{mode: sometimes}]\n",
        "SchedulerExtenderConfig": "weights: {alignment: 0, packing: 0}\n",
    }[KIND[command]]
    path.write_text(head + bad_value)
    code, output = run(command, path)
    assert code == 2
    key = bad_value.split(":")[0]
    assert_one_line(output, f"{path}: {key}")


HEAD = "apiVersion: rdmaplane.io/v1alpha1\nkind: AgentConfig\n"


EXTENDER = "apiVersion: rdmaplane.io/v1alpha1\nkind: SchedulerExtenderConfig\n"


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        (
            "agent.yaml",
            HEAD + "pollInterval: 5s\npollInterval: 10s\n",
            "line 4, column 1: key 'pollInterval' given twice",
        ),
        ("agent.yaml", HEAD + "health: {window: 60s, window: 30s}\n", "key 'window' given twice"),
        (
            "agent.json",
            '{"apiVersion": "rdmaplane.io/v1alpha1", "kind": "AgentConfig", '
            '"pollInterval": "5s", "pollInterval": "10s"}',
            "key 'pollInterval' given twice",
        ),
        ("agent.yaml", HEAD + "pollInterval: .inf\n", "pollInterval: Input should be a finite"),
        (
            "agent.yaml",
            HEAD + "publish: {writeJitter: .nan}\n",
            "publish.writeJitter: Input should be a finite number",
        ),
        (
            "extender.yaml",
            EXTENDER + "weights: {alignment: 1e400}\n",
            "weights.alignment: Input should be a finite number",
        ),
    ],
    ids=["duplicate key", "duplicate in a flow map", "duplicate in JSON", ".inf", ".nan", "1e400"],
)
def test_what_a_parser_would_let_through_is_refused(
    tmp_path: Path, name: str, text: str, said: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    code, output = run("config validate", path)
    assert code == 2
    assert_one_line(output, str(path), said)


def test_every_problem_at_once_cross_field_ones_too(tmp_path: Path) -> None:
    """A bad field, a bad field in a section, and two checks across fields (of the kind and of
    a section) that pydantic runs only once the fields they read are valid."""
    path = tmp_path / "agent.yaml"
    path.write_text(HEAD + "pollInterval: soon\ndra: {enabled: true}\nhealth: {window: -1}\n")
    code, output = run("config validate", path)
    assert code == 2
    assert_one_line(
        output,
        "pollInterval: 'soon' is not a duration",
        "health.window: Input should be greater",
        "dra.enabled: the device plugin is on too",
    )
    extender = tmp_path / "extender.yaml"
    extender.write_text(EXTENDER + "memoEntries: many\nweights: {alignment: 0, packing: 0}\n")
    code, output = run("config validate", extender)
    assert code == 2
    assert_one_line(output, "memoEntries:", "weights: alignment and packing are both 0")


REPO = Path(__file__).resolve().parents[2]


def test_a_manifest_is_checked_document_by_document() -> None:
    """deploy/device-plugin/daemonset.yaml: a ServiceAccount, a ConfigMap holding the config,
    then the DaemonSet; the config is checked, the others named."""
    result = runner.invoke(
        app, ["config", "validate", str(REPO / "deploy/device-plugin/daemonset.yaml")]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].endswith("document 1: a ServiceAccount (v1), not a config (left alone)")
    assert lines[1].endswith(
        "document 2, ConfigMap rdmaplane-device-plugin config.yaml: a valid DevicePluginConfig"
    )
    assert lines[2].endswith("document 3: a DaemonSet (apps/v1), not a config (left alone)")


def test_a_bad_config_inside_a_configmap_is_found(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata:\n  agent.yaml: |\n"
        "    apiVersion: rdmaplane.io/v1alpha1\n    kind: AgentConfig\n"
        "    pollInterval: 1s\n    pollInterval: 2s\n"
        "---\napiVersion: v1\nkind: List\nitems:\n"
        "- {apiVersion: rdmaplane.io/v1alpha1, kind: AgentConfig, surprise: 1}\n"
    )
    result = runner.invoke(app, ["config", "validate", str(path)])
    assert result.exit_code == 2
    errors = result.stderr.splitlines()
    assert len(errors) == 2
    assert "document 1, ConfigMap a agent.yaml: not valid YAML/JSON" in errors[0]
    assert "key 'pollInterval' given twice" in errors[0]
    assert "document 2, items[0]: surprise: unknown key" in errors[1]


def test_a_file_without_any_config_is_refused() -> None:
    result = runner.invoke(app, ["config", "validate", str(REPO / "examples/indexed-job.yaml")])
    assert result.exit_code == 2
    assert_one_line(
        result.output, "no rdmaplane config in it", "a Service (v1)", "a Job (batch/v1)"
    )
