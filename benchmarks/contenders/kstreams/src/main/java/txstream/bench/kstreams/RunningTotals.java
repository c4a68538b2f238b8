package txstream.bench.kstreams;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
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
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The running-totals benchmark's Kafka Streams contender (benchmarks/stateful.py --stateful totals):
 * each customer's orders since the start, as processors/running_totals.py says in Structured
 * Streaming's words (groupBy(customer).agg(count, sum(amount), max(amount)), update mode).
 *
 * <pre>
 * input (byte[] key, schemaless Avro Order)
 *   -> decode, keep amount > 0, key = customer_id, value = amount     [Processor]
 *   -> groupByKey (repartition by customer, "by-customer", through Kafka)
 *   -> aggregate (count, sum, largest) into a KTable ("customer-totals", a changelogged
 *      key-value store)
 *   -> CustomerRunningTotal (schemas/customer_running_total.avsc) -> output (key = customer_id)
 * </pre>
 *
 * Every change of a customer's totals is emitted, after Kafka Streams' record cache (flushed at
 * each commit): update mode. exactly_once_v2, 2 stream threads, commit.interval.ms 100 (its
 * exactly-once default). Runs until SIGTERM.
 */
public final class RunningTotals {

    private RunningTotals() {
    }

    static final LongAdder READ = new LongAdder();
    static final LongAdder EMITTED = new LongAdder();

    /** Decode the order; a positive amount goes on, keyed by customer: one instance per task. */
    static final class KeyByCustomer implements Processor<byte[], byte[], String, Double> {
        private final GenericDatumReader<GenericRecord> reader;
        private final int amount, customer;
        private ProcessorContext<String, Double> context;
        private BinaryDecoder decoder;
        private GenericRecord order;

        KeyByCustomer(Schema inSchema) {
            reader = new GenericDatumReader<>(inSchema);
            amount = inSchema.getField("amount").pos();
            customer = inSchema.getField("customer_id").pos();
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
            double value = (Double) order.get(amount);
            if (value > 0) {
                context.forward(record.withKey(order.get(customer).toString()).withValue(value));
            }
        }
    }

    /** (count, sum, largest) as 24 bytes: the store's value. */
    static byte[] add(byte[] totals, double amount) {
        ByteBuffer was = ByteBuffer.wrap(totals);
        long count = was.getLong();
        double sum = was.getDouble();
        double largest = was.getDouble();
        return ByteBuffer.allocate(24).putLong(count + 1).putDouble(sum + amount)
                         .putDouble(count == 0 ? amount : Math.max(largest, amount)).array();
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = StreamsApp.parseArgs(argv);
        Schema inSchema = new Schema.Parser().parse(new File(args.get("input-schema")));
        Schema outSchema = new Schema.Parser().parse(new File(args.get("output-schema")));

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args.get("input"), Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
               .process(() -> new KeyByCustomer(inSchema))
               .groupByKey(Grouped.with("by-customer", Serdes.String(), Serdes.Double()))
               .aggregate(() -> new byte[24], (customer, amount, totals) -> add(totals, amount),
                          Materialized.<String, byte[], KeyValueStore<Bytes, byte[]>>as("customer-totals")
                                      .withKeySerde(Serdes.String()).withValueSerde(Serdes.ByteArray()))
               .toStream()
               .map((customer, totals) -> {
                   ByteBuffer t = ByteBuffer.wrap(totals);
                   GenericRecord out = new GenericData.Record(outSchema);
                   out.put("customer_id", customer);
                   out.put("orders", t.getLong());
                   out.put("amount", t.getDouble());
                   out.put("largest", t.getDouble());
                   ByteArrayOutputStream buffer = new ByteArrayOutputStream(64);
                   BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(buffer, null);
                   try {
                       new GenericDatumWriter<GenericRecord>(outSchema).write(out, encoder);
                       encoder.flush();
                   } catch (IOException e) {
                       throw new UncheckedIOException(e);
                   }
                   EMITTED.increment();
                   return KeyValue.pair(customer, buffer.toByteArray());
               })
               .to(args.get("output"), Produced.with(Serdes.String(), Serdes.ByteArray()));
        StreamsApp.run(builder.build(), StreamsApp.properties(args),
                       () -> String.format("%d records read, %d totals emitted", READ.sum(), EMITTED.sum()));
    }
}
