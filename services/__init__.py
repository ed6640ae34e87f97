"""The five services (wiring + thin servicers), installed as quarry.services.<name>: the
product keeps them in the top-level services/ folder, mapped here by pyproject.toml."""
