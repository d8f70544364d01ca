"""Options shared by the commands that run on Spark (replay, query, to-parquet), and the session
they open. Spark is imported only when such a command runs; without the ``nsqcli[spark]`` extra
they say what to install in one line (exit 2)."""

from __future__ import annotations

import contextlib
import os

import click

from .command import option


def spark_options(f):
    opts = [
        option("--master", group="Spark", envvar="NSQCLI_SPARK_MASTER", show_envvar=True,
                     help="Spark master: local[*] (default), local[N], spark://HOST:PORT, yarn, k8s://..."),
        option("--remote", group="Spark", envvar="NSQCLI_SPARK_REMOTE", show_envvar=True,
                     help="Spark Connect server, sc://HOST:PORT (it must have nsqcli installed)."),
        option("--conf", "confs", group="Spark", multiple=True, metavar="KEY=VALUE",
                     help="A Spark configuration property (repeatable)."),
        option("--py-files", "py_files", group="Spark", multiple=True, metavar="PATH",
                     help="Ship these to executors instead of nsqcli's own zip (repeatable)."),
        option("--spark-log-level", group="Spark", default="ERROR", show_default=True,
                     type=click.Choice(["ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"],
                                       case_sensitive=False),
                     help="Spark's log level (its log goes to stderr only with -v)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def require_extra(name: str, remote) -> None:
    """One line (exit 2) when the spark extra, or with ``remote`` the Connect client's packages,
    cannot be imported: what is missing, or what failed to import."""
    try:
        from ..spark.session import require
        require(connect=bool(remote))
    except ImportError as e:  # nsqcli.spark itself says what is missing
        missing = isinstance(e, ModuleNotFoundError) and e.name
        what = f"{e.name} is not installed" if missing else str(e).split("] ", 1)[-1].rstrip(".")
        raise click.UsageError(f"nsqcli {name} needs the spark extra: pip install 'nsqcli[spark]' "
                               f"({what})") from None


def session(app, name: str, master, remote, confs, py_files, spark_log_level):
    """Open the SparkSession; one-line errors for a missing extra (exit 2) or Java."""
    import shutil

    require_extra(name, remote)
    from ..spark.session import build
    if master and remote:
        raise click.UsageError("--master and --remote cannot be used together")
    conf = {}
    for kv in confs:
        k, sep, v = kv.partition("=")
        if not sep or not k.strip():
            raise click.UsageError(f"--conf {kv!r}: expected KEY=VALUE")
        conf[k.strip()] = v
    if not remote and shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        from ..errors import NSQError
        raise NSQError("Spark needs Java 17 or 21: no 'java' on PATH and JAVA_HOME is not set")
    try:
        spark, log = build(f"nsqcli {name}", master, remote, conf, spark_log_level.upper(), py_files,
                           verbose=app.verbosity >= 1)
    except Exception as e:
        packages = conf.get("spark.jars.packages")
        if not packages or "JAVA_GATEWAY_EXITED" not in str(e):
            raise
        from ..errors import NSQError  # Ivy's own lines went to Spark's log (shown with -v)
        raise NSQError(f"Spark's JVM exited at start: most likely a jar of spark.jars.packages ({packages}) "
                       "could not be had (not in the Ivy cache ~/.ivy2.5.2 and Maven Central unreachable, "
                       "or no such version); -v shows Spark's resolver") from None
    if log:
        app.debug(f"Spark's log: {log}")
    return spark, log


@contextlib.contextmanager
def spark_session(app, name: str, master, remote, confs, py_files, spark_log_level):
    """session() for the length of a command; Spark's log file is removed unless the command
    failed at run time (then it is kept: -v prints its path at start-up)."""
    spark, log = session(app, name, master, remote, confs, py_files, spark_log_level)
    keep = False
    try:
        yield spark
    except click.UsageError:
        raise
    except BaseException:
        keep = True
        raise
    finally:
        spark.stop()
        if log and not keep:
            try:
                os.unlink(log)
            except OSError:
                pass


def check_archives(paths, remote: str | None = None) -> None:
    """A local archive path that does not exist is a usage error before Spark starts (URLs and
    globs are Spark's to resolve). Under --remote the paths are the Connect server's, which this
    machine may not see: Spark says when one is missing."""
    if remote:
        return
    for p in paths:
        if "://" not in p and not any(c in p for c in "*?[") and not os.path.exists(p):
            raise click.UsageError(f"no such archive file or directory: {p}")


def sink_options(conn: dict) -> dict:
    """The nsq data source options for the CLI's connection options."""
    out = {}
    if conn.get("nsqd_tcp_addresses"):
        out["nsqdTCPAddresses"] = ",".join(conn["nsqd_tcp_addresses"])
    if conn.get("lookupd_http_addresses"):
        out["lookupdHTTPAddresses"] = ",".join(conn["lookupd_http_addresses"])
    if not out:
        from ..defaults import NSQD_TCP_ADDRESS

        out["nsqdTCPAddresses"] = NSQD_TCP_ADDRESS
    pairs = {"tls": "tls", "tls_ca_file": "tlsCAFile", "tls_cert": "tlsCert", "tls_key": "tlsKey",
             "tls_min_version": "tlsMinVersion", "tls_insecure_skip_verify": "tlsInsecureSkipVerify",
             "snappy": "snappy", "deflate": "deflate", "deflate_level": "deflateLevel",
             "auth_secret_file": "authSecretFile", "client_id": "clientId"}
    for key, name in pairs.items():
        v = conn.get(key)
        if v not in (None, False, ()):
            out[name] = str(v).lower() if isinstance(v, bool) else str(v)
    if conn.get("auth_secret"):
        out["authSecret"] = conn["auth_secret"]
    if conn.get("msg_timeout"):
        out["msgTimeout"] = f"{int(conn['msg_timeout'] * 1000)}ms"
    return out


def spark_error(e: BaseException):
    """A click error for an exception Spark raised: SQL problems are usage errors (exit 2)."""
    from ..spark.session import first_line

    name = type(e).__name__
    line = first_line(e)
    if name in ("AnalysisException", "ParseException") or "PARSE_SYNTAX_ERROR" in line:
        return click.UsageError(line)
    from ..errors import NSQError
    return NSQError(line)
