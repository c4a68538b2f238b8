package txstream.bench.kstreams;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.LongAdder;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.processor.PunctuationType;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The wide benchmark's Kafka Streams contender (benchmarks/wide.py): each customer's orders
 * counted and summed per interval, the work of processors/customer_totals.py per micro-batch.
 *
 * <pre>
 * input (byte[] key, schemaless Avro Order) -> decode -> keep amount > 0
 *   -> key = customer_id, value = (amount, items)                      [Processor]
 *   -> repartition by customer ("by-customer", through Kafka)           [Kafka Streams' shuffle]
 *   -> add to the customer's totals in a persistent store ("batch-totals", changelogged)
 *   -> every --emit-interval-ms (wall clock): one CustomerTotals per customer of the interval,
 *      batch_time = the punctuation's time, and the store emptied      [Punctuator]
 *   -> output (key = customer_id)
 * </pre>
 *
 * Per interval, not a running KTable: the output has txstream's and Spark SS's meaning (each
 * record is one "batch" of a customer's orders, so the records add up to the input), and the
 * harness checks it the same way. exactly_once_v2 makes the input offsets, the repartition
 * records, the store's changelog and the emitted totals one transaction per commit
 * (commit.interval.ms at its exactly-once default, 100 ms). num.stream.threads=2. It runs until
 * SIGTERM; the harness stops it once the output's orders add up to the input's.
 */
public final class CustomerTotals {

    private CustomerTotals() {
    }

    static final LongAdder READ = new LongAdder();
    static final LongAdder EMITTED = new LongAdder();
    static final LongAdder EMITS = new LongAdder();
    static final String STORE = "batch-totals";

    /** Decode, keep amount > 0, key by customer: one instance per stream task. */
    static final class KeyByCustomer implements Processor<byte[], byte[], String, byte[]> {
        private final GenericDatumReader<GenericRecord> reader;
        private final int customerId, amount, items;
        private ProcessorContext<String, byte[]> context;
        private BinaryDecoder decoder;
        private GenericRecord order;

        KeyByCustomer(Schema inSchema) {
            reader = new GenericDatumReader<>(inSchema);
            customerId = inSchema.getField("customer_id").pos();
            amount = inSchema.getField("amount").pos();
            items = inSchema.getField("items").pos();
        }

        @Override
        public void init(ProcessorContext<String, byte[]> context) {
            this.context = context;
        }

        @Override
        public void process(Record<byte[], byte[]> record) {
            READ.increment();
            if (record.value() == null) {
                return;
            }
            try {
                decoder = DecoderFactory.get().binaryDecoder(record.value(), decoder);
                order = reader.read(order, decoder);
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
            double amt = (Double) order.get(amount);
            if (!(amt > 0)) {
                return;
            }
            byte[] value = ByteBuffer.allocate(16).putDouble(amt).putLong((Integer) order.get(items)).array();
            context.forward(record.withKey(order.get(customerId).toString()).withValue(value));
        }
    }

    /** Add to the customer's totals; emit and empty the store every interval. */
    static final class BatchTotals implements Processor<String, byte[], String, byte[]> {
        private final Schema outSchema;
        private final GenericDatumWriter<GenericRecord> writer;
        private final long intervalMs;
        private final ByteArrayOutputStream buffer = new ByteArrayOutputStream(64);
        private ProcessorContext<String, byte[]> context;
        private KeyValueStore<String, byte[]> store;
        private BinaryEncoder encoder;

        BatchTotals(Schema outSchema, long intervalMs) {
            this.outSchema = outSchema;
            this.writer = new GenericDatumWriter<>(outSchema);
            this.intervalMs = intervalMs;
        }

        @Override
        public void init(ProcessorContext<String, byte[]> context) {
            this.context = context;
            this.store = context.getStateStore(STORE);
            context.schedule(Duration.ofMillis(intervalMs), PunctuationType.WALL_CLOCK_TIME, this::emit);
        }

        @Override
        public void process(Record<String, byte[]> record) {
            ByteBuffer in = ByteBuffer.wrap(record.value());
            double amount = in.getDouble();
            long items = in.getLong();
            byte[] old = store.get(record.key());
            ByteBuffer totals = ByteBuffer.allocate(24);
            if (old == null) {
                totals.putLong(1).putDouble(amount).putLong(items);
            } else {
                ByteBuffer was = ByteBuffer.wrap(old);
                totals.putLong(was.getLong() + 1).putDouble(was.getDouble() + amount).putLong(was.getLong() + items);
            }
            store.put(record.key(), totals.array());
        }

        private void emit(long timestamp) {
            List<KeyValue<String, byte[]>> all = new ArrayList<>();
            try (KeyValueIterator<String, byte[]> it = store.all()) {
                while (it.hasNext()) {
                    all.add(it.next());
                }
            }
            if (all.isEmpty()) {
                return;
            }
            for (KeyValue<String, byte[]> kv : all) {
                ByteBuffer totals = ByteBuffer.wrap(kv.value);
                GenericRecord out = new GenericData.Record(outSchema);
                out.put("customer_id", kv.key);
                out.put("batch_time", timestamp);
                out.put("orders", totals.getLong());
                out.put("amount", totals.getDouble());
                out.put("items", totals.getLong());
                buffer.reset();
                encoder = EncoderFactory.get().binaryEncoder(buffer, encoder);
                try {
                    writer.write(out, encoder);
                    encoder.flush();
                } catch (IOException e) {
                    throw new UncheckedIOException(e);
                }
                context.forward(new Record<>(kv.key, buffer.toByteArray(), timestamp));
                store.delete(kv.key);
            }
            EMITTED.add(all.size());
            EMITS.increment();
        }
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = StreamsApp.parseArgs(argv);
        Schema inSchema = new Schema.Parser().parse(new File(args.get("input-schema")));
        Schema outSchema = new Schema.Parser().parse(new File(args.get("output-schema")));
        long intervalMs = Long.parseLong(args.getOrDefault("emit-interval-ms", "1000"));

        StreamsBuilder builder = new StreamsBuilder();
        builder.addStateStore(Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(STORE), Serdes.String(),
                                                          Serdes.ByteArray()));
        builder.stream(args.get("input"), Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
               .process(() -> new KeyByCustomer(inSchema))
               .repartition(Repartitioned.with(Serdes.String(), Serdes.ByteArray()).withName("by-customer"))
               .process(() -> new BatchTotals(outSchema, intervalMs), STORE)
               .to(args.get("output"), Produced.with(Serdes.String(), Serdes.ByteArray()));
        Topology topology = builder.build();

        StreamsApp.run(topology, StreamsApp.properties(args),
                       () -> String.format("%d records read, %d totals emitted in %d emits", READ.sum(),
                                           EMITTED.sum(), EMITS.sum()));
    }
}
