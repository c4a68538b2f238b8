"""State that outlives a batch, kept in Kafka (docs/state.md): runs in Spark's Python workers,
where the output unit that owns a state partition runs.

- `store`: the interface every local store implements (reads, writes buffered until the unit's
  transaction commits, the version it holds), and `stores.open_store`.
- `memory`, `rocks`: the in-memory store and the one that spills to disk (RocksDB).
- `codec`: how a state row and a snapshot chunk are encoded.
- `changelog`: the changelog record (key, new value or tombstone, the batch and unit that wrote
  it) and its topic.
- `snapshot`: a store written to Kafka whole, naming the changelog offset it covers.
- `partition`: reading one partition of a state topic to its end, read_committed.
- `restore`: a store brought to the marker's batch from a snapshot plus the changelog's tail.
- `errors`: what can go wrong, in txstream's taxonomy.
"""
