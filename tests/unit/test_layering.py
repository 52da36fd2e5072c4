"""Every arrow points one way (docs/development.md, "Layers").

Two checks:
- a walk over every module's imports (including those inside functions and TYPE_CHECKING blocks)
  against the layer rules;
- each image's package set, rebuilt from package metadata as a site directory holding only the
  distributions its Dockerfile installs and their requirements, run in an isolated interpreter: every
  module of the component imports there, and kopf, the test bed and the other components do not.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]

# package -> (folder, top-level names it must never import)
KUBE = {"kopf", "kubernetes"}
LAYERS: dict[str, tuple[Path, set[str]]] = {
    "trtforge": (
        REPO / "trtforge",
        {"trtforge_operator", "trtforge_builder", "trtforge_runtime", "trtforge_dev", *KUBE},
    ),
    "trtforge_builder": (
        REPO / "builder_job" / "trtforge_builder",
        {"trtforge_operator", "trtforge_runtime", "trtforge_dev", *KUBE},
    ),
    "trtforge_runtime": (
        REPO / "runtime_image" / "trtforge_runtime",
        {"trtforge_operator", "trtforge_builder", "trtforge_dev", *KUBE},
    ),
    "trtforge_operator": (
        REPO / "operator" / "trtforge_operator",
        {"trtforge_builder", "trtforge_runtime", "trtforge_dev"},
    ),
}
# Inside the base package the contract is the bottom: it imports neither the stores nor the CLI.
CONTRACT_FORBIDDEN = {"trtforge.store", "trtforge.cli"}


def imported_modules(path: Path, package: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in one file, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                yield node.lineno, ".".join([*base, node.module] if node.module else base)
            else:
                yield node.lineno, str(node.module)


def module_name(root: Path, path: Path, top: str) -> str:
    """Dotted package name of the file's package (for resolving relative imports)."""
    return ".".join([top, *path.relative_to(root).parent.parts])


def violations(top: str, root: Path, forbidden: set[str]) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for line, mod in imported_modules(path, module_name(root, path, top)):
            if mod.split(".")[0] in forbidden:
                out.append(f"{path.relative_to(root.parent)}:{line} imports {mod}")
            if path.is_relative_to(REPO / "trtforge" / "contract") and any(
                mod == f or mod.startswith(f + ".") for f in CONTRACT_FORBIDDEN
            ):
                out.append(
                    f"{path.relative_to(root.parent)}:{line} imports {mod} (the contract is the bottom)"
                )
    return out


@pytest.mark.parametrize("top", sorted(LAYERS))
def test_no_import_points_up_or_sideways(top: str) -> None:
    root, forbidden = LAYERS[top]
    files = list(root.rglob("*.py"))
    assert len(files) > 3, f"{root}: no modules found, the walk would prove nothing"
    assert violations(top, root, forbidden) == []


def test_the_walk_catches_an_upward_import(tmp_path: Path) -> None:
    pkg = tmp_path / "trtforge_runtime"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "ok.py").write_text("import json\nfrom trtforge.contract import gpu\n")
    (pkg / "sub" / "bad.py").write_text(
        "def f():\n    from trtforge_dev.testbed import handle\n    import kopf\n"
    )
    found = violations("trtforge_runtime", pkg, LAYERS["trtforge_runtime"][1])
    assert found == [
        "trtforge_runtime/sub/bad.py:2 imports trtforge_dev.testbed",
        "trtforge_runtime/sub/bad.py:3 imports kopf",
    ]


# ---------------------------------------------------------------- image package sets

IMAGES = {
    "builder": ("trtforge-builder", "trtforge_builder"),
    "runtime": ("trtforge-runtime", "trtforge_runtime"),
    "operator": ("trtforge-operator", "trtforge_operator"),
}
NEVER = {
    "builder": ["kopf", "kubernetes", "trtforge_dev", "trtforge_operator", "trtforge_runtime"],
    "runtime": ["kopf", "kubernetes", "trtforge_dev", "trtforge_operator", "trtforge_builder"],
    "operator": ["trtforge_dev", "trtforge_builder", "trtforge_runtime"],
}


def closure(root: str) -> set[str]:
    """Normalised names of a distribution and everything it requires (extras and markers honoured)."""
    seen: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        dist = metadata.distribution(name)
        key = dist.metadata["Name"].lower().replace("_", "-")
        for req_text in dist.requires or []:
            req = Requirement(req_text)
            env_ok = any(req.marker is None or req.marker.evaluate({"extra": e}) for e in (extras or {""}))
            if env_ok:
                todo.append((req.name, frozenset(req.extras)))
        seen.add(key)
    return seen


def image_site(dists: set[str], into: Path) -> Path:
    """A site directory holding only these distributions: their files from the venv's site-packages,
    and for an editable install its source packages and metadata."""
    site = into / "site-packages"
    site.mkdir()
    for name in dists:
        dist = metadata.distribution(name)
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        direct = dist.read_text("direct_url.json")
        if direct and json.loads(direct).get("dir_info", {}).get("editable"):
            src = Path(json.loads(direct)["url"].removeprefix("file://"))
            tops = {t for t in tops if t.endswith(".dist-info")}
            for pkg in (dist.read_text("top_level.txt") or "").split():
                (site / pkg).symlink_to(src / pkg)
        for top in tops:
            if top.endswith(".pth") or top.startswith("__editable__") or top == "__pycache__":
                continue
            target = site / top
            if not target.exists() and (base / top).exists():
                target.symlink_to(base / top)
    return site


PROBE = """
import importlib, pkgutil, sys, json
import {package}
mods = [m.name for m in pkgutil.walk_packages({package}.__path__, "{package}.")]
for m in mods:
    importlib.import_module(m)
blocked = []
for name in {never!r}:
    try:
        importlib.import_module(name)
    except ImportError:
        blocked.append(name)
from trtforge.cli import build_parser
sub = next(a for a in build_parser()._actions if a.dest == "command")
print(json.dumps({{"modules": len(mods), "blocked": blocked, "commands": sorted(sub.choices)}}))
"""


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_an_images_package_set_holds_only_its_component(image: str, tmp_path: Path) -> None:
    dist, package = IMAGES[image]
    dists = closure("trtforge") | closure(dist)
    assert ("trtforge-dev" not in dists and "kopf" not in dists) or image == "operator"
    site = image_site(dists, tmp_path)
    code = f"import sys; sys.path.insert(0, {str(site)!r})\n" + PROBE.format(
        package=package, never=NEVER[image]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    # -I: no user site, no PYTHONPATH, no cwd; -S: not the venv's site-packages.
    r = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["modules"] > 3
    assert result["blocked"] == NEVER[image], f"importable in the {image} image: {result}"
    own = {
        "builder": {"build", "stage-model", "quantize", "tune"},
        "runtime": {"serve", "serve-llm", "rank-exec"},
        "operator": {"operator", "broker", "crds"},
    }[image]
    assert set(result["commands"]) == own | {"gpu"}
