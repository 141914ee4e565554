"""app/services is plain Python under app/api: no module of it imports app.api (docs DESIGN.md, "Where things
belong"), at the top of a module or inside a function, absolutely or relatively."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = "app.api"


def imported(path: Path, root: Path) -> list[tuple[int, str]]:
    """Every module (and `from` name) `path` imports, with its line, wherever the import statement stands."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    names: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.append((node.lineno, module))
            names += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]  # `from app import api`
    return names


def api_imports(root: Path) -> list[str]:
    """`path:line: name` of each import of app.api by a module under root/app/services."""
    modules = sorted((root / "app" / "services").rglob("*.py"))
    assert modules, f"no modules under {root / 'app' / 'services'}"
    return [
        f"{path.relative_to(root)}:{line}: {name}"
        for path in modules
        for line, name in imported(path, root)
        if name == FORBIDDEN or name.startswith(FORBIDDEN + ".")
    ]


def test_services_import_nothing_from_the_api() -> None:
    found = api_imports(ROOT)
    assert not found, "app/services must not import app.api (raise app.services.errors.ServiceError):\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    "source",
    [
        "from app.api.problems import ApiError\n",
        "import app.api.auth\n",
        "from app import api\n",
        "def late():\n    from app.api.limits import client_key\n",
        "from ..api import deps\n",
        "from ...app.api import auth\n",
    ],
)
def test_the_check_sees_each_way_of_importing_the_api(tmp_path: Path, source: str) -> None:
    services = tmp_path / "app" / "services"
    services.mkdir(parents=True)
    (services / "fine.py").write_text("from app.core.settings import Settings\nfrom . import errors\n")
    assert api_imports(tmp_path) == []
    (services / "planted.py").write_text(source)
    assert api_imports(tmp_path)
