"""txstream: exactly-once Kafka-to-Kafka stream processors whose transforms are PySpark code."""
__version__ = "0.1.0"
