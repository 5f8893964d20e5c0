import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:  # an installed kvattn (pip install ./python) is tested as installed
    import kvattn  # noqa: F401
except ImportError:  # else from the source tree (the device has no pip install)
    sys.path.insert(0, os.path.dirname(HERE))


def pytest_report_header(config):
    import kvattn
    return f"kvattn {kvattn.__file__} over {kvattn.library_path}"
