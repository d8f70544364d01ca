"""``nsqcli query``: ad-hoc Spark SQL over archives, as the table ``messages``."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import io
import json
import sys

import click

from ..command import command, option
from ..spark_options import check_archives, spark_session, spark_error, spark_options


@command(examples="""
nsqcli query "select hour, count(*) from messages group by hour order by hour" -a /archive/
nsqcli query "select body_text from messages where body_text like '%error%'" -a '/archive/*.gz' --json
nsqcli query "select topic, count(*) n from messages group by topic" -a /archive/ --csv
""")
@click.argument("sql")
@option("-a", "--archive", "archives", multiple=True, required=True, metavar="PATH",
              help="Archive file, directory or glob (repeatable).")
@option("-f", "--format", "fmt", type=click.Choice(["auto", "raw", "json"]), default="auto", show_default=True,
              help="Archive format (auto: from the first record).")
@option("--json", "as_json", is_flag=True, help="NDJSON on stdout (binary values base64).")
@option("--csv", "as_csv", is_flag=True, help="CSV with a header on stdout.")
@option("-n", "--limit", type=click.IntRange(min=1), help="At most this many rows.")
@spark_options
@click.pass_obj
def query(app, sql, archives, fmt, as_json, as_csv, limit, master, remote, confs, py_files, spark_log_level):
    """Run SQL over archives (to-file / nsq_to_file output) as the table `messages`.

    \b
    Columns: body (binary), body_text, topic, channel, nsqd, id, timestamp, attempts (JSON
    archives), host and hour (from nsq_to_file-style file names), file.
    Output: an aligned table (default), --json (NDJSON) or --csv. An error in the SQL is one line
    with Spark's message, exit 2.
    """
    if as_json and as_csv:
        raise click.UsageError("--json and --csv cannot be used together")
    check_archives(archives, remote)
    with spark_session(app, "query", master, remote, confs, py_files, spark_log_level) as spark:
        from ...spark.jobs import messages_table

        try:
            messages_table(spark, archives, fmt)
            df = spark.sql(sql)
            if limit:
                df = df.limit(limit)
            columns = df.columns
            rows = [tuple(r) for r in df.collect()]
        except Exception as e:
            raise spark_error(e) from None
    _print(rows, columns, "json" if as_json else "csv" if as_csv else "table")
    return 0


def _text(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ")
    return str(v)


def _json(v):
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        return [_json(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json(x) for k, x in v.items()}
    if hasattr(v, "asDict"):
        return _json(v.asDict())
    if type(v).__name__ == "Decimal":
        return float(v)
    return v


def _print(rows, columns, kind: str) -> None:
    from ..app import write_stdout

    if kind == "json":
        write_stdout("".join(json.dumps({c: _json(v) for c, v in zip(columns, r)}, ensure_ascii=False) + "\n"
                             for r in rows))
        return
    if kind == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        w.writerows([[_text(v) for v in r] for r in rows])
        write_stdout(buf.getvalue())
        return
    cells = [[_text(v).replace("\n", "\\n") for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(r[i], (int, float)) or r[i] is None for r in rows) and rows for i in range(len(columns))]

    def line(values):
        return "  ".join(v.rjust(w) if numeric[i] else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    out = [line(columns)] + [line(r) for r in cells]
    write_stdout("\n".join(out) + "\n")
    if sys.stderr.isatty():
        print(f"({len(rows)} row{'s' * (len(rows) != 1)})", file=sys.stderr)
