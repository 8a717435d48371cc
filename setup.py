"""Packages found in their folders: ``edgeattn/`` and the folders mapped into it (``exporters/`` is
``edgeattn.exporters``, ``runtime/`` is ``edgeattn.runtime``, ``serving/`` is ``edgeattn.serving``),
each with every subpackage, so that a new family's folders need no line here. The rest is
``pyproject.toml``'s."""

from setuptools import find_packages, setup

#: package -> the folder it is installed from
PACKAGE_DIR = {"edgeattn": "edgeattn", "edgeattn.exporters": "exporters", "edgeattn.runtime": "runtime",
               "edgeattn.serving": "serving"}  # fmt: skip


def packages() -> list[str]:
    """Every mapped package and its subpackages, under their installed names."""
    return [name for package, folder in PACKAGE_DIR.items()
            for name in (package, *(f"{package}.{sub}" for sub in find_packages(folder)))]  # fmt: skip


if __name__ == "__main__":  # as the build runs it (not when a test reads PACKAGE_DIR)
    setup(packages=packages(), package_dir=PACKAGE_DIR)
