"""`onnxmt keys`: the API keys of `onnxmt serve --key-db` (serve/limits.py), each with limits of its own. A running
server sees a change at its next request."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from .common import fail
from .help import Command, Group

if TYPE_CHECKING:
    from ..serve.limits import KeyStore

keys = typer.Typer(
    cls=Group, help="API keys of `onnxmt serve --key-db`, with limits of their own.", no_args_is_help=True
)

DbOption = Annotated[
    str,
    typer.Option("--key-db", envvar="ONNXMT_KEY_DB", help="The SQLite key database (created when missing)."),
]


def _store(path: str) -> KeyStore:
    from ..serve.limits import KeyStore

    try:
        return KeyStore(path)
    except Exception as e:  # sqlite3.Error, OSError: not a database, not writable
        fail(f"cannot open the key database {path}: {e}")


@keys.command("add", cls=Command)
def add(
    key_db: DbOption,
    key: Annotated[str | None, typer.Argument(help="The key (default: a new random one, printed).")] = None,
    req_limit: Annotated[
        int | None, typer.Option(min=0, help="Requests per window for this key (default: --req-limit).")
    ] = None,
    char_limit: Annotated[
        int | None, typer.Option(min=0, help="Characters per request for this key (default: --char-limit).")
    ] = None,
    daily_char_limit: Annotated[
        int | None, typer.Option(min=0, help="Characters per day for this key (default: --daily-char-limit).")
    ] = None,
) -> None:
    """Add a key (or change the limits of one); 0 is no limit."""
    key = key or secrets.token_urlsafe(24)
    store = _store(key_db)
    try:
        store.add(key, req_limit, char_limit, daily_char_limit)
    except ValueError as e:
        fail(str(e))
    finally:
        store.close()
    print(key)


@keys.command("remove", cls=Command)
def remove(key_db: DbOption, key: Annotated[str, typer.Argument(help="The key to remove.")]) -> None:
    """Remove a key."""
    store = _store(key_db)
    try:
        if not store.remove(key):
            fail(f"no such key in {key_db}")
    finally:
        store.close()


@keys.command("list", cls=Command)
def list_keys(key_db: DbOption) -> None:
    """The keys and their limits (blank: the server's)."""
    store = _store(key_db)
    try:
        rows = store.keys()
    finally:
        store.close()
    table = Table("key", "req_limit", "char_limit", "daily_char_limit")
    for row in rows:
        shown = [row.req_limit, row.char_limit, row.daily_char_limit]
        table.add_row(row.key, *("" if v is None else str(v) for v in shown))
    Console().print(table)
