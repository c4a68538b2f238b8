"""txstream: exactly-once Kafka-to-Kafka stream processors whose transforms are PySpark code."""
from txstream.processor import Processor

__all__ = ["Processor"]
__version__ = "0.1.0"
