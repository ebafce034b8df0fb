"""Packaging glue: the model zoo (models/), the hardware profiles (hardware_profiles/) and the software
stacks (stacks/) are package data.

They live at the top of the checkout (where the README and the tests name them); a built wheel
carries a copy under ``dlsim/_data/``. `dlsim.io.paths` looks there first and falls back to the
checkout, so both are found the same way. Everything else is in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA = ("models", "hardware_profiles", "stacks")


class build_py_with_data(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        root = Path(__file__).resolve().parent
        for name in DATA:
            target = Path(self.build_lib) / "dlsim" / "_data" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(root / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": build_py_with_data})
