"""Write what comes from the port counter table (`rdmaplane.core.counters`) into the files that show
it: the counter table in docs/agent.md (between its markers) and the counter lists of the
Grafana dashboard's panels (each panel the table names gets one query per counter, with the
function, `rate` or `increase`, the panel already uses).

    python scripts/counter-tables.py            # rewrite the files
    python scripts/counter-tables.py --check    # exit 1 naming the files that are out of date

`--root DIR` works on another checkout (the tests use a copy).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rdmaplane.core.counters import HW, PORT_COUNTERS, PortCounter

DOCS = "docs/agent.md"
DASHBOARD = "deploy/grafana/rdmaplane-dashboard.json"
BEGIN = "<!-- counters: begin (scripts/counter-tables.py writes this table) -->"
END = "<!-- counters: end -->"
QUERY = (
    'sum by (instance, hca, port) ({fn}(rdmaplane_port_{metric}_total{{instance=~"$node", '
    'hca=~"$hca"}}[$__rate_interval]))'
)
FUNCTION = re.compile(r"\((rate|increase)\(rdmaplane_port_")


def docs_table() -> str:
    """Every counter: file, where it lives, the metric, its default health rules (within the
    window, within an hour), what it counts."""
    lines = [
        "| counter file | directory | metric | default threshold | class | per hour | class | counts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in PORT_COUNTERS:
        where = "`hw_counters/` (mlx5)" if c.directory == HW else "`ports/N/counters/` (PMA)"
        metric = f"`rdmaplane_port_{c.metric}_total`" if c.metric else "—"
        if c.metric and c.scale != 1:
            metric += f" (× {c.scale})"
        threshold = "—" if c.threshold is None else str(c.threshold)
        cls = c.cls.value if c.cls is not None else "—"
        hourly = "—" if c.hourly is None else str(c.hourly)
        hourly_cls = c.hourly_cls.value if c.hourly_cls is not None else "—"
        rules = f"{threshold} | {cls} | {hourly} | {hourly_cls}"
        lines.append(f"| `{c.name}` | {where} | {metric} | {rules} | {c.help} |")
    return "\n".join(lines)


def with_docs_table(text: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return f"{text[:start]}\n{docs_table()}\n{text[end:]}"


def panel_targets(panel: dict[str, Any], counters: list[PortCounter]) -> list[dict[str, str]]:
    found = FUNCTION.search(panel["targets"][0]["expr"]) if panel.get("targets") else None
    fn = found.group(1) if found else "increase"
    return [
        {
            "refId": chr(ord("A") + i),
            "expr": QUERY.format(fn=fn, metric=c.metric),
            "legendFormat": f"{c.name} {{{{instance}}}} {{{{hca}}}}",
        }
        for i, c in enumerate(counters)
    ]


def with_dashboard_counters(text: str) -> str:
    board = json.loads(text)
    by_panel: dict[str, list[PortCounter]] = {}
    for c in PORT_COUNTERS:
        if c.panel is not None:
            by_panel.setdefault(c.panel, []).append(c)
    titles = {p.get("title") for p in board["panels"]}
    missing = sorted(set(by_panel) - titles)
    if missing:
        raise SystemExit(f"error: {DASHBOARD} has no panel {', '.join(missing)}")
    for panel in board["panels"]:
        counters = by_panel.get(panel.get("title", ""))
        if counters:
            panel["targets"] = panel_targets(panel, counters)
    return json.dumps(board, indent=2, ensure_ascii=False) + "\n"


FILES: dict[str, Callable[[str], str]] = {
    DOCS: with_docs_table,
    DASHBOARD: with_dashboard_counters,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)
    stale = []
    for name, rewrite in FILES.items():
        path = args.root / name
        text = path.read_text()
        wanted = rewrite(text)
        if wanted != text:
            stale.append(name)
            if not args.check:
                path.write_text(wanted)
    if stale and args.check:
        print(f"error: out of date, run scripts/counter-tables.py: {', '.join(stale)}")
        return 1
    for name in stale:
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
