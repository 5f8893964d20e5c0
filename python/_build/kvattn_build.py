"""PEP 517 backend: setuptools, after putting libkvattn.so into kvattn/lib/.

The library comes from $KVATTN_LIBRARY if set, else the repository's
build/libkvattn.so, else it is built with CMake into build-py/lib (the CUDA
backend too when nvcc is found). The staged copy is removed from the source
tree after the wheel is written, so a source-tree import never finds a stale one.
"""
import os
import shutil
import subprocess

from setuptools import build_meta as _sm
from setuptools.build_meta import *  # noqa: F401,F403  (the other hooks)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
ROOT = os.path.dirname(HERE)
STAGED = os.path.join(HERE, "kvattn", "lib", "libkvattn.so")


def _find_or_build():
    env = os.environ.get("KVATTN_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise RuntimeError(f"KVATTN_LIBRARY={env} does not exist")
        return env
    built = os.path.join(ROOT, "build", "libkvattn.so")
    if os.path.isfile(built):
        return built
    if not os.path.isfile(os.path.join(ROOT, "CMakeLists.txt")):
        raise RuntimeError("libkvattn.so not found: set KVATTN_LIBRARY or install from the kvattn "
                           "source tree")
    out = os.path.join(ROOT, "build-py", "lib")
    jobs = os.environ.get("KVATTN_BUILD_JOBS", "2")
    subprocess.check_call(["cmake", "-S", ROOT, "-B", out, "-DCMAKE_BUILD_TYPE=Release"])
    subprocess.check_call(["cmake", "--build", out, "-j", jobs, "--target", "kvattn_shared"])
    return os.path.join(out, "libkvattn.so")


def _staged(hook):
    def run(*args, **kwargs):
        src = _find_or_build()
        os.makedirs(os.path.dirname(STAGED), exist_ok=True)
        shutil.copy2(src, STAGED)
        try:
            return hook(*args, **kwargs)
        finally:
            os.remove(STAGED)
            try:
                os.rmdir(os.path.dirname(STAGED))
            except OSError:
                pass
    return run


build_wheel = _staged(_sm.build_wheel)
if hasattr(_sm, "build_editable"):
    build_editable = _sm.build_editable  # editable: the source tree finds the build dirs itself
