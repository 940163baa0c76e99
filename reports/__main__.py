"""`python -m reports RESULTS.csv [MORE.csv ...] [--html OUT.html] [--markdown OUT.md]`:
render saved results; prints the terminal summary; exit status 1 when any row FAILs or ERRORs."""
from __future__ import annotations

import argparse
import sys

from .html import write_html
from .markdown import render_markdown
from .results import read_results, summarize
from .terminal import render_terminal


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reports", description=__doc__.split("\n")[1])
    p.add_argument("csv", nargs="+", help="long-form result CSV(s)")
    p.add_argument("--html", help="write the self-contained HTML page here")
    p.add_argument("--markdown", help="write the markdown summary here ('-' for stdout)")
    a = p.parse_args(argv)
    df = read_results(a.csv)
    if a.html:
        write_html(df, a.html, {"sources": ", ".join(a.csv)})
    if a.markdown == "-":
        sys.stdout.write(render_markdown(df))
    elif a.markdown:
        with open(a.markdown, "w", encoding="utf-8") as f:
            f.write(render_markdown(df))
    sys.stdout.write(render_terminal(df))
    return 1 if summarize(df)["overall"] == "FAIL" else 0


if __name__ == "__main__":
    sys.exit(main())
