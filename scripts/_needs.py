"""A module that is not in Python's standard library, or one line that says
which interpreter lacks it and how to install it for that interpreter.

    from _needs import need
    load_digits = need("sklearn.datasets", "scikit-learn", "python3-sklearn", "digits.py").load_digits
    np = need("numpy", "numpy", "python3-numpy", "digits.py")

Debian's packages (apt-get, scripts/setup.sh) install into
/usr/lib/python3/dist-packages, which only Debian's own /usr/bin/python3
reads; another interpreter (pyenv's, a venv, a conda one) needs the module
from its own pip. The advice follows the interpreter that ran the script.
"""
import importlib
import os
import sys

DEBIAN_PYTHON = "/usr/bin/python3"
DEBIAN_PACKAGES = "/usr/lib/python3/dist-packages"


def interpreter():
    """'/usr/bin/python3 (Python 3.11.2)': the interpreter running this script."""
    return f"{sys.executable or 'python3'} (Python {sys.version.split()[0]})"


def install_advice(pip_name, debian_package, script):
    """How to get `pip_name` for this interpreter: Debian's package when this
    interpreter reads Debian's packages, else its own pip (or Debian's
    interpreter, once the package is installed)."""
    if DEBIAN_PACKAGES in sys.path:
        return (f"install Debian's package for it: apt-get install {debian_package} "
                f"(or: bash scripts/setup.sh {debian_package})")
    advice = f"install it for this interpreter: {sys.executable or 'python3'} -m pip install {pip_name}"
    if os.path.exists(DEBIAN_PYTHON):
        advice += (f"; or run the script with Debian's interpreter, which reads Debian's package: "
                   f"bash scripts/setup.sh {debian_package} && {DEBIAN_PYTHON} scripts/{script} ...")
    return advice


def missing(module, pip_name, debian_package, script, error):
    """The message for a module that cannot be imported (`error`, the ImportError)."""
    return (f"{script}: {pip_name} (module {module.split('.')[0]}) cannot be imported by {interpreter()}: "
            f"{error}; {install_advice(pip_name, debian_package, script)}")


def need(module, pip_name, debian_package, script):
    """The imported `module`; else exits with status 1 and `missing`'s message."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        sys.exit(missing(module, pip_name, debian_package, script, error))
