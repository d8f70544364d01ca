"""``NSQDataSource``: the one data source named "nsq" (stream source, batch and stream sink).

    from nsqcli.spark import register
    register(spark)
    df.write.format("nsq").option("nsqdTCPAddresses", "127.0.0.1:4150").option("topic", "t").save()
    spark.readStream.format("nsq").option("topic", "t").option("lookupdHTTPAddresses", "...").load()

Options are documented in README.md ("Spark"); every bad one is an error at planning time.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource


class NSQDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self):
        from .source import SCHEMA
        return SCHEMA

    def writer(self, schema, overwrite: bool):
        from .sink import NSQWriter
        return NSQWriter(self.options, schema)

    def streamWriter(self, schema, overwrite: bool):
        from .sink import NSQStreamWriter
        return NSQStreamWriter(self.options, schema)

    def streamReader(self, schema):
        from .source import NSQStreamReader
        return NSQStreamReader(self.options, schema)
