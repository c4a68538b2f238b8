package txstream.bench.kstreams;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Map;
import java.util.concurrent.atomic.AtomicBoolean;
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
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;

/**
 * The txstream benchmarks' Kafka Streams contender: the same work as every other contender.
 *
 * <pre>
 * input (byte[] key, schemaless Avro Order) -> decode -> keep amount > 0
 *   -> amount_cents = (long) (amount * 100), is_large = amount > 100 -> encode OrderEnriched
 *   -> output (same key bytes)
 * </pre>
 *
 * processing.guarantee=exactly_once_v2, num.stream.threads=2, commit.interval.ms at Kafka
 * Streams' exactly-once default (100 ms), auto.offset.reset=earliest, application.id = the
 * run's group. Like the hand-written loop it runs until it is stopped: the harness watches the
 * output topic (read_committed) and sends SIGTERM once every expected record is there; a
 * shutdown hook then closes KafkaStreams cleanly.
 *
 * (long) (amount * 100) truncates toward zero like Python's int(amount * 100) and Spark's
 * cast("long"); amount > 0 and amount > 100 are false for NaN in all of them.
 */
public final class EnrichOrders {

    private EnrichOrders() {
    }

    static final LongAdder READ = new LongAdder();
    static final LongAdder WRITTEN = new LongAdder();
    static final AtomicBoolean FIRST_SEEN = new AtomicBoolean(false);

    /** Decode, filter, enrich, encode: one instance per stream task (so per thread, no sharing). */
    static final class Enrich implements FixedKeyProcessor<byte[], byte[], byte[]> {
        private final Schema outSchema;
        private final GenericDatumReader<GenericRecord> reader;
        private final GenericDatumWriter<GenericRecord> writer;
        private final int id, customerId, amount, currency, createdAt, items;
        private final int outId, outCustomerId, outAmountCents, outCurrency, outCreatedAt, outItems, outIsLarge;
        private final ByteArrayOutputStream buffer = new ByteArrayOutputStream(256);
        private FixedKeyProcessorContext<byte[], byte[]> context;
        private BinaryDecoder decoder;
        private BinaryEncoder encoder;
        private GenericRecord order;

        Enrich(Schema inSchema, Schema outSchema) {
            this.outSchema = outSchema;
            this.reader = new GenericDatumReader<>(inSchema);
            this.writer = new GenericDatumWriter<>(outSchema);
            id = inSchema.getField("id").pos();
            customerId = inSchema.getField("customer_id").pos();
            amount = inSchema.getField("amount").pos();
            currency = inSchema.getField("currency").pos();
            createdAt = inSchema.getField("created_at").pos();
            items = inSchema.getField("items").pos();
            outId = outSchema.getField("id").pos();
            outCustomerId = outSchema.getField("customer_id").pos();
            outAmountCents = outSchema.getField("amount_cents").pos();
            outCurrency = outSchema.getField("currency").pos();
            outCreatedAt = outSchema.getField("created_at").pos();
            outItems = outSchema.getField("items").pos();
            outIsLarge = outSchema.getField("is_large").pos();
        }

        @Override
        public void init(FixedKeyProcessorContext<byte[], byte[]> context) {
            this.context = context;
        }

        @Override
        public void process(FixedKeyRecord<byte[], byte[]> record) {
            READ.increment();
            if (!FIRST_SEEN.get() && FIRST_SEEN.compareAndSet(false, true)) {
                System.err.printf("kafka-streams: first input record after %.1fs%n", StreamsApp.seconds());
            }
            byte[] value = record.value();
            if (value == null) {
                return;  // a tombstone is no order (the seeded input has none)
            }
            try {
                decoder = DecoderFactory.get().binaryDecoder(value, decoder);
                order = reader.read(order, decoder);
                double amt = (Double) order.get(amount);
                if (!(amt > 0)) {
                    return;
                }
                GenericRecord out = new GenericData.Record(outSchema);
                out.put(outId, order.get(id));
                out.put(outCustomerId, order.get(customerId));
                out.put(outAmountCents, (long) (amt * 100));
                out.put(outCurrency, order.get(currency));
                out.put(outCreatedAt, order.get(createdAt));
                out.put(outItems, order.get(items));
                out.put(outIsLarge, amt > 100);
                buffer.reset();
                encoder = EncoderFactory.get().binaryEncoder(buffer, encoder);
                writer.write(out, encoder);
                encoder.flush();
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
            context.forward(record.withValue(buffer.toByteArray()));
            WRITTEN.increment();
        }
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = StreamsApp.parseArgs(argv);
        Schema inSchema = new Schema.Parser().parse(new File(args.get("input-schema")));
        Schema outSchema = new Schema.Parser().parse(new File(args.get("output-schema")));

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args.get("input"), Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
               .processValues(() -> new Enrich(inSchema, outSchema))
               .to(args.get("output"), Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
        Topology topology = builder.build();

        StreamsApp.run(topology, StreamsApp.properties(args),
                       () -> String.format("%d records read, %d written", READ.sum(), WRITTEN.sum()));
    }
}
