"""The input's two schema versions for the schema-registry tests (no .avsc files)."""

# v1 and v2 of the input, as a producer team would evolve it: v2 adds `currency` with a default
# (BACKWARD compatible) and drops `note`.
ORDER_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "amount", "type": "double"}]}
ORDER_V2 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "amount", "type": "double"},
    {"name": "currency", "type": "string", "default": "EUR"}]}
