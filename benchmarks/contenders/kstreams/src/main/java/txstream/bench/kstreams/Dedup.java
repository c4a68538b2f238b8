package txstream.bench.kstreams;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.atomic.LongAdder;

import org.apache.avro.Schema;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.WindowStoreIterator;

/**
 * The dedup benchmark's Kafka Streams contender (benchmarks/stateful.py --stateful dedup): orders
 * deduplicated by id within 10 minutes of event time, as processors/unique_orders.py says in
 * Structured Streaming's words (withWatermark(created_at, 10 minutes)
 * .dropDuplicatesWithinWatermark(id), append mode).
 *
 * The way Confluent's event-deduplication example does it: a processor with a changelogged window
 * store of the ids seen ("seen-ids", retention = window = 10 minutes); an order whose id the store
 * holds within 5 minutes either side of its event time is dropped, otherwise it is forwarded and
 * its id remembered. Event time = created_at (CurrencyWindows.CreatedAt). The input is keyed by
 * order id, so no repartition. exactly_once_v2, 2 stream threads. Runs until SIGTERM.
 */
public final class Dedup {

    private Dedup() {
    }

    static final LongAdder READ = new LongAdder();
    static final LongAdder EMITTED = new LongAdder();
    static final String STORE = "seen-ids";
    static final Duration WITHIN = Duration.ofMinutes(10);

    /** Forward an order the first time its id is seen: one instance per task. */
    static final class DropSeen implements Processor<byte[], byte[], byte[], byte[]> {
        private final long left = WITHIN.toMillis() / 2, right = WITHIN.toMillis() - WITHIN.toMillis() / 2;
        private ProcessorContext<byte[], byte[]> context;
        private WindowStore<String, Long> seen;
        private BinaryDecoder decoder;

        @Override
        public void init(ProcessorContext<byte[], byte[]> context) {
            this.context = context;
            this.seen = context.getStateStore(STORE);
        }

        @Override
        public void process(Record<byte[], byte[]> record) {
            READ.increment();
            if (record.value() == null) {
                return;
            }
            String id;
            try {   // id is the Order's first field
                decoder = DecoderFactory.get().binaryDecoder(record.value(), decoder);
                id = decoder.readString();
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
            long t = record.timestamp();
            boolean duplicate;
            try (WindowStoreIterator<Long> it = seen.fetch(id, t - left, t + right)) {
                duplicate = it.hasNext();
            }
            seen.put(id, t, t);
            if (!duplicate) {
                EMITTED.increment();
                context.forward(record);
            }
        }
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = StreamsApp.parseArgs(argv);
        Schema inSchema = StreamsApp.schema(args, "input-schema");
        CurrencyWindows.CreatedAt.checkLayout(inSchema);
        if (!inSchema.getFields().get(0).name().equals("id")) {
            throw new IllegalArgumentException("Order schema: field 0 is not id");
        }

        StreamsBuilder builder = new StreamsBuilder();
        builder.addStateStore(Stores.windowStoreBuilder(Stores.persistentWindowStore(STORE, WITHIN, WITHIN, false),
                                                        Serdes.String(), Serdes.Long()));
        builder.stream(args.get("input"), Consumed.with(Serdes.ByteArray(), Serdes.ByteArray())
                                                  .withTimestampExtractor(new CurrencyWindows.CreatedAt()))
               .process(DropSeen::new, STORE)
               .to(args.get("output"), Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
        StreamsApp.run(builder.build(), StreamsApp.properties(args),
                       () -> String.format("%d records read, %d orders emitted", READ.sum(), EMITTED.sum()));
    }
}
