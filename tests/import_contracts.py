"""An import-linter contract type import-linter lacks: an allow-list. `lint-imports` loads it
(pyproject's `contract_types`); the built-in `forbidden` type can only name what is denied, so
a module that starts importing something new would pass unseen."""

from __future__ import annotations

import sys

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output
from importlinter.domain import helpers


class AllowedImportsContract(Contract):
    """Each source module imports directly only the standard library (when `stdlib` is true),
    the other source modules, and `allowed_modules` (ours by dotted name, third-party packages
    by their top-level name)."""

    type_name = "allowed"

    source_modules = fields.ListField(subfield=fields.ModuleExpressionField())
    allowed_modules = fields.ListField(subfield=fields.ModuleExpressionField(), required=False)
    stdlib = fields.BooleanField(required=False, default=True)

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        sources = _names(graph, self.source_modules)  # type: ignore[arg-type]
        allowed = sources | _names(graph, self.allowed_modules or [])  # type: ignore[arg-type]
        for name in sources:
            if name not in graph.modules:
                raise ValueError(f"Module '{name}' does not exist.")
        stdlib = sys.stdlib_module_names if self.stdlib else frozenset()  # type: ignore[truthy-bool]
        broken = []
        for importer in sorted(sources):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                if imported in allowed or imported.split(".")[0] in stdlib:
                    continue
                lines = graph.get_import_details(importer=importer, imported=imported)
                broken.append((importer, imported, sorted({d["line_number"] for d in lines})))
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, imported, lines in check.metadata["broken"]:
            where = ", ".join(f"l.{n}" for n in lines)
            output.print(f"{importer} imports {imported} ({where}), not on the allow-list")
        output.new_line()


def _names(graph: ImportGraph, expressions: list[object]) -> set[str]:
    return {m.name for m in helpers.module_expressions_to_modules(graph, expressions)}  # type: ignore[arg-type]
