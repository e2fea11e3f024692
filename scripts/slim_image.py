"""Slims the container image's Python files (run by the Containerfile, not by the programs).

  slim_image.py venv VENV            byte-compile a virtual environment for a read-only image
  slim_image.py stdlib-used OUT      list the standard-library modules the programs import
  slim_image.py stdlib-prune LIST    drop the standard library's cached byte code of the others

`venv`: metricscale's own packages keep their sources and cached byte code (tracebacks show the
code). Every other package is compiled in place to sourceless `.pyc` files (Python loads a
`module.pyc` standing where `module.py` was), its `.py`, `.pyi` and cached byte code removed, its
C extensions stripped of symbols, and kubernetes_asyncio's own tests removed. kubernetes_asyncio's
generated API and model classes (all that `import kubernetes_asyncio` loads, although only its
kubeconfig loader is used) are compiled without their docstrings (everything else keeps its
docstrings and asserts), and the package is stored as one zip file on sys.path.

`stdlib-used` imports every module of the four packages and lists the standard-library files
they loaded; `stdlib-prune` then removes Debian's cached byte code (written for the whole
standard library at install time) of every other standard-library module. Those modules still
import, from source (the root filesystem is read-only, so that byte code is not kept).
"""

from __future__ import annotations

import compileall
import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

OURS = ("adapter", "autoscaler", "cli", "metricscale")
WITHOUT_DOCSTRINGS = ("kubernetes_asyncio/client/api", "kubernetes_asyncio/client/models")
# Pure-Python packages stored as one compressed zip on sys.path (zipimport): about 1,000 modules
# that `import kubernetes_asyncio` loads in full, 9 MB of byte code that deflates to 3 MB.
ZIPPED = ("kubernetes_asyncio",)
# Files kubernetes_asyncio's wheel puts at the top of site-packages (its RECORD lists them).
STRAY = {"kubernetes_asyncio": ("CHANGELOG.md", "CONTRIBUTING.md", "README.md", "pyproject.toml")}


def _site_packages(venv: Path) -> Path:
    (site,) = venv.glob("lib/python3*/site-packages")
    return site


def _is_test_or_stub(path: Path) -> bool:
    name = path.name
    return (path.suffix == ".pyi" or name.endswith("_test.py")
            or (name.startswith("test_") and path.suffix == ".py")
            or name.startswith("_testcapi"))


def slim_venv(venv: Path) -> None:
    site = _site_packages(venv)
    for cache in list(site.rglob("__pycache__")):
        shutil.rmtree(cache)
    for path in list(site.rglob("*")):
        if path.is_file() and _is_test_or_stub(path) and path.parts[len(site.parts)] not in OURS:
            path.unlink()
    extensions = [str(path) for path in site.rglob("*.so")]
    if extensions:
        subprocess.run(["strip", "--strip-unneeded", *extensions], check=True)
    for entry in sorted(site.iterdir()):
        if entry.name in OURS:
            if not compileall.compile_dir(entry, quiet=1):
                raise SystemExit(f"cannot compile {entry}")
            continue
        if entry.is_dir():
            # First: the whole-package compile below finds these .pyc files up to date (same
            # source mtime and size in their header) and keeps them as they are.
            for relative in WITHOUT_DOCSTRINGS:
                if (site / relative).is_relative_to(entry):
                    compileall.compile_dir(site / relative, quiet=1, legacy=True, optimize=2)
            ok = compileall.compile_dir(entry, quiet=1, legacy=True, optimize=0)
            sources = list(entry.rglob("*.py"))
        elif entry.suffix == ".py":
            ok = compileall.compile_file(entry, quiet=1, legacy=True)
            sources = [entry]
        else:
            continue
        if not ok:
            raise SystemExit(f"cannot compile {entry}")
        for source in sources:
            source.unlink()
    for package, names in STRAY.items():
        record = next(site.glob(f"{package}-*.dist-info/RECORD")).read_text().splitlines()
        for name in names:
            if any(line.startswith(f"{name},") for line in record) and (site / name).exists():
                (site / name).unlink()
    for package in ZIPPED:
        _zip_package(site, package)


def _zip_package(site: Path, package: str) -> None:
    root = site / package
    if any(root.rglob("*.so")):
        raise SystemExit(f"{package} has extension modules: zipimport cannot load them")
    with zipfile.ZipFile(site / f"{package}.zip", "w", zipfile.ZIP_DEFLATED,
                         compresslevel=9) as archive:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(site).as_posix())
    shutil.rmtree(root)
    (site / f"{package}-zip.pth").write_text(f"{package}.zip\n")


def stdlib_used(out: Path) -> None:
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    for name in OURS:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            if not info.name.endswith(".__main__"):
                importlib.import_module(info.name)
    files = sorted({os.path.realpath(module.__file__) for module in list(sys.modules.values())
                    if getattr(module, "__file__", None)
                    and os.path.realpath(module.__file__).startswith(stdlib + os.sep)})
    out.write_text("".join(f"{path}\n" for path in files))


def stdlib_prune(listing: Path) -> None:
    used = set(listing.read_text().split())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for cache in stdlib.rglob("__pycache__"):
        if "site-packages" in cache.parts or "dist-packages" in cache.parts:
            continue
        for compiled in cache.glob("*.pyc"):
            source = cache.parent / (compiled.name.split(".", 1)[0] + ".py")
            if os.path.realpath(source) not in used:
                compiled.unlink()


def main(argv: list[str]) -> None:
    commands = {"venv": slim_venv, "stdlib-used": stdlib_used, "stdlib-prune": stdlib_prune}
    if len(argv) != 2 or argv[0] not in commands:
        raise SystemExit(__doc__)
    commands[argv[0]](Path(argv[1]))


if __name__ == "__main__":
    main(sys.argv[1:])
