"""Example processors users copy: pass-through, Avro enricher, fan-out, router."""
