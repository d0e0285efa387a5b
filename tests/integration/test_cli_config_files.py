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
