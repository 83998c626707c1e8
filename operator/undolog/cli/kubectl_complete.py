"""`kubectl_complete-undolog`: kubectl (1.26+) completes a plugin's arguments by running this
command with the words typed so far, the last one the word being completed, and reading one
completion per line and then cobra's directive line (`:4`: no file names). The completions are
the `undolog` command's own (typer's bash protocol, asked in this process)."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import sys

NO_FILE_COMPLETION = 4  # cobra's ShellCompDirectiveNoFileComp


def main() -> None:
    from undolog.cli.app import app

    words = sys.argv[1:] or [""]
    os.environ.update(
        {
            "_UNDOLOG_COMPLETE": "complete_bash",
            "COMP_WORDS": " ".join(["undolog", *(shlex.quote(w) if w else "" for w in words)]),
            "COMP_CWORD": str(len(words)),
        }
    )
    answered = io.StringIO()
    with contextlib.redirect_stdout(answered), contextlib.suppress(SystemExit):
        app(prog_name="undolog")
    for completion in answered.getvalue().splitlines():
        print(completion)
    print(f":{NO_FILE_COMPLETION}")
