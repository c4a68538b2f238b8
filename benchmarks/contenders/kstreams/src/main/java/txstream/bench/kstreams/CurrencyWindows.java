package txstream.bench.kstreams;

import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.LongAdder;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.TimestampExtractor;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The windowed benchmark's Kafka Streams contender (benchmarks/windowed.py): orders per currency
 * per 1-minute tumbling window of event time (created_at), 30 s of grace, count and sum of
 * amount: what processors/orders_per_currency.py says in Structured Streaming's words.
 *
 * <pre>
 * input (byte[] key, schemaless Avro Order), event time = created_at    [TimestampExtractor]
 *   -> decode -> key = currency, value = amount                          [Processor]
 *   -> groupByKey (repartition by currency, "by-currency", through Kafka)
 *   -> windowedBy(TimeWindows.ofSizeAndGrace(1 min, 30 s)) -> aggregate (count, sum) in a
 *      changelogged window store ("currency-windows")
 *   -> suppress(untilWindowCloses(unbounded))    final results only, like Spark's append mode
 *   -> CurrencyWindow (schemas/currency_window.avsc: start, end, currency, orders, amount)
 *   -> output (key = currency)
 * </pre>
 *
 * With --suppress false the suppress step is left out: every change of a window's aggregate is
 * emitted (after Kafka Streams' record cache, flushed at each commit), Spark's update mode.
 *
 * A window closes when the task's stream time (the largest created_at it has seen) passes the
 * window's end + grace; a record for a window already closed is dropped and counted in the
 * task's dropped-records metric, printed with the counts at shutdown. exactly_once_v2,
 * num.stream.threads=2, commit.interval.ms at its exactly-once default (100 ms). It runs until
 * SIGTERM; the harness stops it once every window the input closes has been emitted.
 */
public final class CurrencyWindows {

    private CurrencyWindows() {
    }

    static final LongAdder READ = new LongAdder();
    static final LongAdder EMITTED = new LongAdder();
    static final String STORE = "currency-windows";

    /**
     * Event time = created_at, read without decoding the whole order: the fields before it (two
     * strings and a double) are skipped. The layout is checked against the schema at start.
     * One instance serves every task and thread, so the decoder is per thread.
     */
    static final class CreatedAt implements TimestampExtractor {
        private final ThreadLocal<BinaryDecoder> decoder = new ThreadLocal<>();

        static void checkLayout(Schema schema) {
            List<Schema.Field> f = schema.getFields();
            String[] names = {"id", "customer_id", "amount", "currency", "created_at"};
            Schema.Type[] types = {Schema.Type.STRING, Schema.Type.STRING, Schema.Type.DOUBLE, Schema.Type.STRING,
                                   Schema.Type.LONG};
            for (int i = 0; i < names.length; i++) {
                if (!f.get(i).name().equals(names[i]) || f.get(i).schema().getType() != types[i]) {
                    throw new IllegalArgumentException("Order schema: field " + i + " is not " + names[i]);
                }
            }
        }

        @Override
        public long extract(ConsumerRecord<Object, Object> record, long partitionTime) {
            byte[] value = (byte[]) record.value();
            if (value == null) {
                return record.timestamp();
            }
            try {
                BinaryDecoder d = DecoderFactory.get().binaryDecoder(value, decoder.get());
                decoder.set(d);
                d.skipString();
                d.skipString();
                d.readDouble();
                d.skipString();
                return d.readLong();
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
    }

    /** Decode the order, key it by currency, keep its amount: one instance per stream task. */
    static final class KeyByCurrency implements Processor<byte[], byte[], String, Double> {
        private final GenericDatumReader<GenericRecord> reader;
        private final int amount, currency;
        private ProcessorContext<String, Double> context;
        private BinaryDecoder decoder;
        private GenericRecord order;

        KeyByCurrency(Schema inSchema) {
            reader = new GenericDatumReader<>(inSchema);
            amount = inSchema.getField("amount").pos();
            currency = inSchema.getField("currency").pos();
        }

        @Override
        public void init(ProcessorContext<String, Double> context) {
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
            context.forward(record.withKey(order.get(currency).toString()).withValue((Double) order.get(amount)));
        }
    }

    /** (count, sum) as 16 bytes: the window store's value. */
    static byte[] add(byte[] totals, double amount) {
        ByteBuffer was = ByteBuffer.wrap(totals);
        return ByteBuffer.allocate(16).putLong(was.getLong() + 1).putDouble(was.getDouble() + amount).array();
    }

    static long dropped() {
        KafkaStreams streams = StreamsApp.current;
        if (streams == null) {
            return -1;
        }
        long sum = 0;
        for (Map.Entry<MetricName, ? extends Metric> e : streams.metrics().entrySet()) {
            if (e.getKey().name().equals("dropped-records-total") && e.getValue().metricValue() instanceof Number n) {
                sum += n.longValue();
            }
        }
        return sum;
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = StreamsApp.parseArgs(argv);
        Schema inSchema = new Schema.Parser().parse(new File(args.get("input-schema")));
        Schema outSchema = new Schema.Parser().parse(new File(args.get("output-schema")));
        boolean suppress = Boolean.parseBoolean(args.getOrDefault("suppress", "true"));
        CreatedAt.checkLayout(inSchema);

        StreamsBuilder builder = new StreamsBuilder();
        KTable<Windowed<String>, byte[]> windows = builder
            .stream(args.get("input"), Consumed.with(Serdes.ByteArray(), Serdes.ByteArray())
                                               .withTimestampExtractor(new CreatedAt()))
            .process(() -> new KeyByCurrency(inSchema))
            .groupByKey(Grouped.with("by-currency", Serdes.String(), Serdes.Double()))
            .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMinutes(1), Duration.ofSeconds(30)))
            .aggregate(() -> new byte[16], (currency, amount, totals) -> add(totals, amount),
                       Materialized.<String, byte[], WindowStore<Bytes, byte[]>>as(STORE)
                                   .withKeySerde(Serdes.String()).withValueSerde(Serdes.ByteArray()));
        if (suppress) {
            windows = windows.suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded())
                                                 .withName("until-window-closes"));
        }
        windows.toStream()
               .map((window, totals) -> {
                   ByteBuffer t = ByteBuffer.wrap(totals);
                   GenericRecord out = new GenericData.Record(outSchema);
                   out.put("start", window.window().start());
                   out.put("end", window.window().end());
                   out.put("currency", window.key());
                   out.put("orders", t.getLong());
                   out.put("amount", t.getDouble());
                   EMITTED.increment();
                   return KeyValue.pair(window.key(), StreamsApp.avro(outSchema, out));
               })
               .to(args.get("output"), Produced.with(Serdes.String(), Serdes.ByteArray()));
        Topology topology = builder.build();

        Properties props = StreamsApp.properties(args);
        if (args.containsKey("max-partition-fetch-bytes")) {
            // Smaller fetches per partition keep the input partitions' tasks closer together in
            // event time (a whole partition in one 1 MB fetch runs one task ahead of the others,
            // and the windows it closes drop the others' records).
            props.put(StreamsConfig.consumerPrefix(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG),
                      args.get("max-partition-fetch-bytes"));
        }
        StreamsApp.run(topology, props,
                       () -> String.format("%d records read, %d windows emitted, dropped-records-total %d",
                                           READ.sum(), EMITTED.sum(), dropped()));
    }
}
