"""The package as a user installs it: the wheel (distribution `torch-advisor`, command and import package
`advisor`) built from the checkout's sources, installed with no index into a new virtual environment beside an
existing torch (this one's, on the new environment's path: no download), and `advisor profile` run from there
on a script outside the repository. Its trial runs under the new environment's Python and imports the wheel's
advisor, and the report renders from the wheel's templates."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow

STEP = """
import torch

model = torch.nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(x):
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


if __name__ == "__main__":
    for _ in range(200):
        train_step(torch.randn(8, 16))
"""


def test_the_wheel_installs_beside_an_existing_torch_and_profiles_a_script(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "advisor", src / "advisor", ignore=ignore)
    shutil.copytree(ROOT / "templates", src / "templates", ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(tmp_path / "dist")],
                   check=True, capture_output=True, timeout=180)
    wheel = next((tmp_path / "dist").glob("*.whl"))
    assert wheel.name.startswith("torch_advisor-"), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        assert "Name: torch-advisor" in archive.read(info).decode()
        points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "advisor = advisor.cli:main" in points
    assert any(n.startswith("advisor/templates/") and n.endswith(".j2") for n in names)

    # A new environment whose torch (and the other dependencies) is this one's: a path entry, no download.
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "existing_torch.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --no-index: every dependency must be found installed; pip runs for the new environment (--python).
    subprocess.run([*pip, "--python", str(python), "install", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=300)

    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(textwrap.dedent(STEP))
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([env / "bin" / "advisor", "profile", "train.py:train_step", "--no-apply", "--device", "cpu",
                           "--steps", "1", "--windows", "1", "--window", "0.1", "--out", "session"],
                          cwd=job, capture_output=True, text=True, timeout=300, env=clean)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((job / "session" / "trials" / "00-baseline" / "trial.json").read_text())
    assert record["status"] == "ok" and record["python"] == str(python), (record["status"], record["python"])
    assert (job / "session" / "report.html").stat().st_size > 10_000
    where = subprocess.run([python, "-c", "import advisor; print(advisor.__file__)"], capture_output=True, text=True,
                           env=clean, cwd=job, check=True).stdout.strip()
    assert where == str(Path(purelib) / "advisor" / "__init__.py"), where
