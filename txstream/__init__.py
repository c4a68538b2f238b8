"""txstream: exactly-once Kafka-to-Kafka stream processors whose transforms are PySpark code."""
from txstream.processor import Processor, Table

__all__ = ["Processor", "Table"]
__version__ = "0.1.0"
