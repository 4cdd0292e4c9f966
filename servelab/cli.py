"""The ``servelab`` command line: the app and its entry point; the commands live in
``servelab/cli_*.py`` (one module per family) and register themselves on import.
"""

from __future__ import annotations

import sys
from importlib import import_module

from rich.markup import escape

from servelab.cli_app import USER_ERRORS, app, console, err_console, fail
from servelab.endpoint_cli import register as register_endpoint
from servelab.roofline_cli import register as register_roofline

__all__ = ["USER_ERRORS", "app", "console", "err_console", "fail", "main"]

# Importing a command module registers its commands; the order is the order of --help.
for _module in ("cli_run", "cli_calibrate", "cli_live", "cli_search", "cli_inspect"):
    import_module(f"servelab.{_module}")
register_roofline(app)  # servelab fit, servelab plan
register_endpoint(app)  # servelab bench, servelab server


def main() -> None:
    """Console-script entry point.

    A bug (any exception that is not a :class:`UserError`) prints one line saying so, with
    exit code 3; ``SERVELAB_DEBUG=1`` shows the traceback.
    """
    import os

    try:
        code = app(standalone_mode=False)  # click returns an Exit's code in this mode
    except KeyboardInterrupt:  # pragma: no cover - interactive
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:
        if type(exc).__name__ == "Abort":  # click's Ctrl-C at a prompt
            err_console.print("interrupted")
            sys.exit(130)
        show, exit_code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(exit_code, int):  # click's usage error (exit 2)
            show()
            sys.exit(exit_code)
        if os.environ.get("SERVELAB_DEBUG"):
            raise
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
        err_console.print(f"[bold red]internal error (please report; SERVELAB_DEBUG=1 shows "
                          f"the traceback):[/] {escape(text)}", highlight=False, soft_wrap=True)
        sys.exit(3)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()

