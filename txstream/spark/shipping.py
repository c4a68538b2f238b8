"""The processor's own code, shipped to the executors with the job (Spark's `addPyFile`).

Spark pickles a Python UDF by reference to its module: an executor on another host imports that
module, and fails with ModuleNotFoundError unless the code is there. For `package.module:Class`
the whole top-level package is zipped; for `path/file.py:Class` the file's directory (its `.py`
files and the packages beside it, which the file may import). Code installed in the executors'
environment (site-packages) is never shipped: it is already there, and shipping it would shadow
the installed version. Local masters share this machine's files and need none of this.
"""
from __future__ import annotations

import importlib.util
import sys
import tempfile
import zipfile
from pathlib import Path

SKIPPED_DIRS = {"__pycache__", ".git", ".venv", "venv", "node_modules", ".tox", ".mypy_cache", ".pytest_cache"}
MAX_FILES = 5000   # a directory this large is not a processor's code: refuse rather than zip it


def _installed(path: Path) -> bool:
    return any(part in ("site-packages", "dist-packages") for part in path.parts)


def _package_files(root: Path) -> list[Path]:
    """The files of a package directory (nested packages and data included, caches and VCS not)."""
    files = []
    for path in sorted(root.rglob("*")):
        if any(part in SKIPPED_DIRS or part.startswith(".") for part in path.relative_to(root).parts):
            continue
        if path.is_file() and path.suffix not in (".pyc", ".pyo"):
            files.append(path)
    return files


def _siblings(directory: Path) -> list[tuple[Path, str]]:
    """A file processor's directory: its `.py` files and the packages (dirs with __init__.py) in it."""
    entries: list[tuple[Path, str]] = []
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.suffix == ".py":
            entries.append((path, path.name))
        elif path.is_dir() and (path / "__init__.py").is_file() and path.name not in SKIPPED_DIRS:
            entries += [(f, f"{path.name}/{f.relative_to(path)}") for f in _package_files(path)]
    return entries


def code_to_ship(processor_class: type) -> tuple[list[tuple[Path, str]], str | None]:
    """(files with their names inside the archive, the module name executors import) for the
    processor's code; no files when it is installed code or txstream's own (executors import
    it from their installation)."""
    name = processor_class.__module__
    module = sys.modules.get(name)
    file = Path(getattr(module, "__file__", "") or "")
    if name.startswith("txstream_user_") and file.name:
        # Loaded from a path (settings.load_processor): importable on executors by its stem.
        return _siblings(file.resolve().parent), file.stem
    top = name.split(".")[0]
    spec = importlib.util.find_spec(top) if file.name and top != "txstream" else None
    if spec is None or _installed(file.resolve()):
        return [], name
    if spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations))).resolve()
        if _installed(root):
            return [], name
        return [(f, f"{top}/{f.relative_to(root)}") for f in _package_files(root)], name
    return [(file.resolve(), file.name)], name


def build_archive(files: list[tuple[Path, str]], directory: str | None = None) -> Path:
    """A zip of the files (importable from sys.path as Spark adds it on the executors)."""
    if len(files) > MAX_FILES:
        from txstream.errors import SettingsError

        raise SettingsError(f"the processor's code to ship has {len(files)} files (more than {MAX_FILES}): "
                            "install the processor's package on the executors instead (docs/cluster.md)")
    out_dir = Path(directory or tempfile.mkdtemp(prefix="txstream-code-"))
    archive = out_dir / "txstream-processor-code.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, name in files:
            zf.write(path, name)
    return archive


def ship_processor_code(spark, processor_class: type) -> tuple[Path | None, str | None]:
    """Zip the processor's code and add it to the job (every executor puts it on sys.path).
    Returns (the archive or None, the module executors import)."""
    files, module = code_to_ship(processor_class)
    if not files:
        return None, module
    archive = build_archive(files)
    spark.sparkContext.addPyFile(str(archive))
    return archive, module
