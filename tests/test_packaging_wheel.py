"""The built wheel installs whole (issue 16): the zoo and the profiles are package data.

Builds the wheel from this checkout (no network: --no-build-isolation, --no-deps), installs it into
a fresh venv that sees the dependencies installed for this test run (a .pth file naming this interpreter's
site-packages, behind the venv's own; an editable install there stays inactive), and runs, from
an empty directory, `dlsim models` (non-empty) and the README's first command. About 10-30 s.
"""

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_first_command() -> list[str]:
    from docs_examples import readme_ci_commands
    command = readme_ci_commands()[0].split("&&", 1)[1].strip()
    assert command.startswith("dlsim ")
    return command.split()[1:]


@pytest.mark.packaging
def test_wheel_installs_with_zoo_and_profiles(tmp_path):
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            str(ROOT), "-w", str(wheels)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next(wheels.glob("dlsim-*.whl"))
    import zipfile
    names = zipfile.ZipFile(wheel).namelist()
    assert "dlsim/py.typed" in names  # typed package (PEP 561)
    assert {f"dlsim/schemas/{k}.schema.json" for k in ("model", "profile", "strategy", "sweep", "stack")} <= set(names)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # the dependencies installed for this test run (this interpreter's site-packages), appended after the new
    # venv's own, where the wheel goes; not the base interpreter's, which need not hold them
    here = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    there = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    Path(there, "test-deps.pth").write_text("".join(f"{path}\n" for path in sorted(here)))
    # --ignore-installed: a dlsim installed where test-deps.pth points (an editable install of a checkout)
    # would otherwise count as already there and the wheel would not be installed
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                              "--no-index", "--ignore-installed", str(wheel)], capture_output=True, text=True,
                             timeout=300)
    assert install.returncode == 0, install.stderr[-2000:]
    work = tmp_path / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DLSIM_MODELS", "DLSIM_PROFILES")}

    def dlsim(*args: str) -> subprocess.CompletedProcess:
        code = "import sys; from dlsim.cli import entry; sys.argv[0] = 'dlsim'; entry()"
        return subprocess.run([str(python), "-c", code, *args], cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)

    where = subprocess.run([str(python), "-c", "import dlsim; print(dlsim.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True)
    assert str(env_dir) in where.stdout, f"the wheel's dlsim is not the one imported: {where.stdout}{where.stderr}"
    models = dlsim("models", "--json")
    assert models.returncode == 0, models.stderr
    assert len(__import__("json").loads(models.stdout)) >= 5
    profiles = dlsim("profiles")
    assert profiles.returncode == 0 and "dgx-h100" in profiles.stdout
    first = dlsim(*_readme_first_command())
    assert first.returncode == 0, first.stderr[-2000:]
    assert "iteration" in first.stdout.lower()
