"""``gateway.spark``: the broker as a PySpark 4 Python data source.

    from gateway.spark import GatewayDataSource
    spark.dataSource.register(GatewayDataSource)
    spark.read.format("gateway").option("url", "http://127.0.0.1:8161").option("topic", "plant.*.temp").load()

A network client of the broker: it reads the topic archive over the admin
HTTP API (Arrow IPC) and writes over STOMP.  Options: see README ("Spark").
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from gateway.spark import options
from gateway.spark.reader import SCHEMA, ArchiveReader, ArchiveStreamReader, FilteringArchiveReader
from gateway.spark.writer import GatewayStreamWriter, GatewayWriter

__all__ = ["GatewayDataSource"]


class GatewayDataSource(DataSource):
    """Registered as format ``gateway``; every option is checked when Spark plans."""

    @classmethod
    def name(cls) -> str:
        return "gateway"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        given = options.read_options(self.options, streaming=False)
        return (FilteringArchiveReader if given.push_filters else ArchiveReader)(given, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ArchiveStreamReader(options.read_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise options.OptionError("a broker destination cannot be overwritten; write with mode append")
        return GatewayWriter(options.write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return GatewayStreamWriter(options.write_options(self.options), schema)
