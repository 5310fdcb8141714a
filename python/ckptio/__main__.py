"""The ``ckptio`` command and ``python -m ckptio``: run the C command-line tool.

The tool (tools/, the same program `cmake --install` puts in bin/) ships inside the package as
``ckptio/bin/ckptio``; the ``ckptio`` console script that pip installs and ``python -m ckptio`` both
replace themselves with it (``execv``), so its arguments, output, exit status and signals are the tool's
own.
"""

import os
import sys


def executable() -> str:
    """Path of the command-line tool inside the installed package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "ckptio")


def main() -> None:
    path = executable()
    try:
        os.execv(path, ["ckptio", *sys.argv[1:]])
    except OSError as exc:
        sys.exit(f"ckptio: cannot run the command-line tool {path}: {exc.strerror or exc}")


if __name__ == "__main__":
    main()
