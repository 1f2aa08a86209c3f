"""`provision` command line (filled in by the foundation work)."""

import typer

app = typer.Typer(help="rigbase control plane")
