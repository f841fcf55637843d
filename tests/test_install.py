"""nbddp installed as users install it, each time into a fresh virtual environment (docs/install.md):

- from its wheel (`pip wheel --no-deps`), its dependencies from the configured package index;
- offline from a wheelhouse (`pip wheel`: nbddp and every dependency), the Kaggle route with internet off:
  `pip install --no-index --find-links <wheelhouse> nbddp`, with every pip setting of this machine stripped.

Each then runs the installed `nbddp` outside the checkout, so a wheel that lacks the templates, the runtime
modules or a subpackage fails here. nbddp's wheel is built once, from a copy of the working tree (a build in the
checkout itself would write build/ and nbddp.egg-info/ there); the wheelhouse is that wheel plus every dependency
(`pip wheel` of the built wheel resolves the metadata the source has, without a second build)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = Path("notebooks") / "tiny_llama_sft.ipynb"  # the README's example, relative to the source
TIMEOUT = 600
# what a build copy skips when the source is not a git checkout
IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", "*.egg-info", "build", "dist", ".pytest_cache",
                                "outputs", "tiny-llama", "lora_model", "train_ddp*.py", "tiny_alpaca.jsonl")


def run(cmd, *, env=None, cwd=None, ok=True):
    """Run cmd; with ok, fail the test showing its output unless it exits 0."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=TIMEOUT)
    if ok and proc.returncode != 0:
        pytest.fail(f"exit {proc.returncode}: {' '.join(map(str, cmd))}\n--- stdout\n{proc.stdout[-6000:]}"
                    f"\n--- stderr\n{proc.stderr[-6000:]}", pytrace=False)
    return proc


def copy_source(dest: Path) -> Path:
    """The working tree as a clone would have it, plus files not yet added (git's ignore rules applied)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True) if shutil.which("git") else None
    if listed is None or listed.returncode != 0:
        shutil.copytree(REPO, dest, ignore=IGNORE)
        return dest
    for name in filter(None, listed.stdout.split("\0")):
        src = REPO / name
        if src.is_file():  # a tracked file deleted in the working tree is left out, as a build would
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def pip_has_python_option() -> bool:
    """pip >= 22.3 installs into another interpreter (`pip --python`), so the venvs need no pip of their own."""
    try:
        from importlib.metadata import version
        major, minor = (int(part) for part in version("pip").split(".")[:2])
    except Exception:
        return False
    return (major, minor) >= (22, 3)


def stripped_env() -> dict:
    """This environment without any pip setting: no config file, no PIP_* variable (index, find-links,
    constraints), and no PYTHONPATH that could import nbddp from elsewhere."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip reads no config file at all
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


class Venv:
    def __init__(self, path: Path, env: dict):
        self.path, self.env = path, env
        bindir = path / ("Scripts" if os.name == "nt" else "bin")
        self.python = bindir / ("python.exe" if os.name == "nt" else "python")
        self.nbddp = bindir / ("nbddp.exe" if os.name == "nt" else "nbddp")

    def pip(self, *args, env=None, ok=True):
        if pip_has_python_option():
            cmd = [sys.executable, "-m", "pip", "--python", self.python]
        else:
            cmd = [self.python, "-m", "pip"]
        return run([*cmd, *args], env=env or self.env, ok=ok)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Source copy, nbddp's wheel alone (dist/) and a full wheelhouse (wheelhouse/: that wheel and every
    dependency), built once."""
    if importlib.util.find_spec("venv") is None:
        pytest.skip("this Python has no venv module: no fresh environment to install into")
    if importlib.util.find_spec("pip") is None:
        pytest.skip("this Python has no pip: cannot build a wheel")
    root = tmp_path_factory.mktemp("install")
    src = copy_source(root / "src")
    dist, wheelhouse = root / "dist", root / "wheelhouse"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", src, "-w", dist])
    run([sys.executable, "-m", "pip", "wheel", only_wheel(dist), "-w", wheelhouse])
    return root, src, dist, wheelhouse


def make_venv(path: Path, env: dict) -> Venv:
    args = ["--without-pip"] if pip_has_python_option() else []
    proc = run([sys.executable, "-m", "venv", *args, path], env=env, ok=False)
    if proc.returncode != 0 and not args and "ensurepip" in proc.stdout + proc.stderr:
        pytest.skip(f"`python -m venv` cannot install pip here (no ensurepip): {proc.stderr.strip()[-300:]}")
    if proc.returncode != 0:
        pytest.fail(f"python -m venv failed:\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    return Venv(path, env)


def only_wheel(folder: Path) -> Path:
    wheels = sorted(folder.glob("nbddp-*.whl"))
    assert len(wheels) == 1, f"expected one nbddp wheel in {folder}, found {[w.name for w in wheels]}"
    return wheels[0]


def check_installed(venv: Venv, src: Path, work: Path):
    """The installed nbddp, run from outside the checkout: import, --help, both conversions, every file."""
    work.mkdir()
    env = {**venv.env, "PATH": f"{venv.nbddp.parent}{os.pathsep}{venv.env.get('PATH', '')}"}
    where = run([venv.python, "-c", "import nbddp; print(nbddp.__file__)"], env=env, cwd=work).stdout.strip()
    package = Path(where).resolve().parent
    assert package.is_relative_to(venv.path.resolve()), f"nbddp imported from {where}, not from the venv"

    # every file of the source's package is in the installed one (templates, runtime modules, subpackages)
    wanted = {p.relative_to(src / "nbddp").as_posix() for p in (src / "nbddp").rglob("*")
              if p.is_file() and "__pycache__" not in p.parts}
    installed = {p.relative_to(package).as_posix() for p in package.rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts}
    assert any(name.startswith("templates/") and name.endswith(".j2") for name in wanted)
    missing = sorted(wanted - installed)
    assert not missing, f"the installed package lacks {missing}"

    assert "convert" in run([venv.nbddp, "--help"], env=env, cwd=work).stdout

    notebook = shutil.copy(src / NOTEBOOK, work / NOTEBOOK.name)
    run([venv.nbddp, "convert", notebook], env=env, cwd=work)
    run([venv.nbddp, "convert", notebook, "--single-file", "-o", "single.py"], env=env, cwd=work)
    for name in ("train_ddp.py", "train_ddp_runtime.py", "single.py"):
        path = work / name
        assert path.is_file(), f"`nbddp convert` did not write {name}"
        compile(path.read_text(encoding="utf-8"), str(path), "exec")
    assert "train_ddp_runtime" in (work / "train_ddp.py").read_text(encoding="utf-8")
    assert "train_ddp_runtime" not in (work / "single.py").read_text(encoding="utf-8")


def test_wheel_installs_into_a_fresh_venv(built, tmp_path):
    root, src, dist, _ = built
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    venv = make_venv(tmp_path / "venv", env)
    venv.pip("install", "--no-compile", only_wheel(dist))  # its dependencies from the configured index
    check_installed(venv, src, tmp_path / "work")


def test_wheelhouse_installs_offline(built, tmp_path):
    root, src, _, wheelhouse = built
    env = stripped_env()
    only_wheel(wheelhouse)
    venv = make_venv(tmp_path / "venv", env)
    ours = (":env:.config-file=", ":env:.disable-pip-version-check=")  # what stripped_env sets
    left = [line for line in venv.pip("config", "list", env=env).stdout.splitlines()
            if line.strip() and not line.startswith(ours)]
    assert not left, f"pip still has settings in the stripped environment: {left}"
    venv.pip("install", "--no-compile", "--no-index", "--find-links", wheelhouse, "nbddp", env=env)
    check_installed(venv, src, tmp_path / "work")
