"""Python as on a bare CUDA image, for tests of the GPU check: put this folder on PYTHONPATH, and every Python
process started with it (the check's children too) imports this module at startup.

An import made by the project's own files finds only the standard library, the image's packages
(scripts.gpu_check.BARE_IMAGE), the project itself, and GPU_WHEELS from outside this environment's site-packages
(on that machine they come from wheels installed into a temporary folder). Packages the project imports from
there, e.g. torch's own dependencies, are not limited. Anything else, wandb and datasets included, is missing.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("model", "data", "train", "inspector", "scripts", "tests")
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from scripts.gpu_check import BARE_IMAGE, GPU_WHEELS  # noqa: E402 - after the path is set

for _name in ("scripts.gpu_check", "scripts"):  # read for the lists only: `-m scripts.gpu_check` runs it afresh
    sys.modules.pop(_name, None)

WHEEL_MODULES = {name.replace("-", "_") for name in GPU_WHEELS}
ALLOWED = set(sys.stdlib_module_names) | set(BARE_IMAGE) | set(PROJECT) | {"__main__"}


def _importer() -> str:
    """The file of the first frame outside the import machinery: who asked for the module."""
    frame = sys._getframe(2)
    while frame is not None and ("importlib" in frame.f_code.co_filename or frame.f_code.co_filename.startswith("<")):
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else ""


def _from_project(filename: str) -> bool:
    path = Path(filename).resolve()
    return any(path.is_relative_to(ROOT / d) for d in PROJECT)


class BareImage(importlib.abc.MetaPathFinder):
    """Stands in for the path finder: the same search, but without the modules a bare image lacks."""

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in WHEEL_MODULES and "." not in name:  # only from outside site-packages, as from the wheels' folder
            path = [p for p in sys.path if "site-packages" not in p]
        elif top not in ALLOWED and top not in WHEEL_MODULES and _from_project(_importer()):
            return None  # absent, as on the image
        return importlib.machinery.PathFinder.find_spec(name, path, target)


sys.meta_path[:] = [BareImage() if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
