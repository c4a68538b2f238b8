"""txstream: exactly-once Kafka-to-Kafka stream processors whose transforms are PySpark code."""
from txstream.processor import Input, Processor, Table

__all__ = ["Input", "Processor", "Table"]
__version__ = "0.1.0"
