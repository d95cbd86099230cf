"""Optional integrations with other tools (Inspect AI first): extras, never imported by the core.

Each subpackage may import anything of opsarena and its own extra's libraries;
nothing in opsarena imports this package, so `import opsarena` and the CLI work
without any integration installed (`tests/integrations/test_core_imports.py`).
"""
