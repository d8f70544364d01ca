"""``NSQDataSource``: the one data source named "nsq" (stream source, batch and stream sink).

    from nsqcli.spark import register
    register(spark)
    df.write.format("nsq").option("nsqdTCPAddresses", "127.0.0.1:4150").option("topic", "t").save()
    spark.readStream.format("nsq").option("topic", "t").option("lookupdHTTPAddresses", "...").load()

Options are documented in README.md ("Spark"). Every mistake (an unknown option, a Kafka option,
a bad value, a user schema, a Kafka column, mode("overwrite")) is refused with one OptionError
saying what to do instead, as early as Spark lets a Python data source speak (pyspark 4.3.0):

- ``readStream...load()`` calls ``schema()``: the options are checked there, so load() raises.
  With ``.schema(...)`` given, Spark calls nothing in Python at load(): the schema (and the
  options) are refused when the query starts, by ``streamReader``.
- ``df.write...save()`` calls ``writer()`` before any task: save() raises.
- ``writeStream...start()`` returns before Spark calls ``streamWriter()`` (in the query's
  thread): the query fails at once and awaitTermination() / exception() carry the message.
- ``spark.read.format("nsq").load()`` calls ``schema()`` too (Spark does not say batch or
  stream); ``reader()`` refuses at the first action (collect, count, write...).
"""

from __future__ import annotations

import functools

from pyspark.sql.datasource import DataSource, DataSourceStreamReader

from . import options as opt

BATCH_READ = ("spark.read.format('nsq') would consume the channel without a checkpoint; use "
              "spark.readStream.format('nsq') with .trigger(availableNow=True), which reads what is there "
              "now and stops, exactly once (option 'spoolLocation' and the query's checkpointLocation)")
OVERWRITE = ("mode('overwrite') is not possible: NSQ only appends (published messages cannot be taken back); "
             "use mode('append')")
COMPLETE = ("outputMode('complete') would publish the whole result table again on every trigger: NSQ only "
            "appends; use outputMode('append') (for an aggregation, with a watermark)")


def _refusal(method):
    """An OptionError leaves with a traceback of one frame: Spark prints the worker's traceback
    into the message the user sees, so our stack below this method would only bury the line."""
    @functools.wraps(method)
    def refuse_clearly(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except opt.OptionError as e:
            refusal = e.detail
        raise opt.OptionError(refusal) from None
    return refuse_clearly


def _source_settings(options):
    from .plan import SourceSettings  # pure: no pyspark, checks every value
    return SourceSettings(options)


class NSQDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "nsq"

    # -- source ------------------------------------------------------------------------------
    def _check_source(self) -> None:
        opt.check_options(self.options, "source")
        _source_settings(self.options)

    @_refusal
    def schema(self):
        from .source import SCHEMA
        self._check_source()
        return SCHEMA

    def streamReader(self, schema):
        from .source import SCHEMA, NSQStreamReader
        try:
            opt.check_source_schema([(f.name, f.dataType.simpleString()) for f in schema.fields], SCHEMA)
            self._check_source()
        except opt.OptionError as e:
            # raised here, Spark's source runner fails on its own `finally: reader.stop()` and the
            # user reads "UnboundLocalError: cannot access local variable 'reader'": hand Spark
            # a reader that says our line when asked for the first offset instead
            return _Refused(e.detail)
        return NSQStreamReader(self.options, schema)

    @_refusal
    def reader(self, schema):
        raise opt.OptionError(BATCH_READ)

    # -- sink --------------------------------------------------------------------------------
    @_refusal
    def writer(self, schema, overwrite: bool):
        opt.check_options(self.options, "sink")
        if overwrite:
            raise opt.OptionError(OVERWRITE)
        from .sink import NSQWriter
        return NSQWriter(self.options, schema)

    @_refusal
    def streamWriter(self, schema, overwrite: bool):
        opt.check_options(self.options, "sink")
        if overwrite:  # Spark passes overwrite=True for outputMode("complete")
            raise opt.OptionError(COMPLETE)
        from .sink import NSQStreamWriter
        return NSQStreamWriter(self.options, schema)


class _Refused(DataSourceStreamReader):
    """The stream reader of a query that must not run: every call raises the refusal."""

    def __init__(self, detail: str):
        self.detail = detail

    def initialOffset(self):
        raise opt.OptionError(self.detail)

    def latestOffset(self, start=None, limit=None):
        raise opt.OptionError(self.detail)

    def partitions(self, start, end):
        raise opt.OptionError(self.detail)

    def read(self, partition):
        raise opt.OptionError(self.detail)
