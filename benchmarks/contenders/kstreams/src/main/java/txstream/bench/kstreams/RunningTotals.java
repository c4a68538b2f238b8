package txstream.bench.kstreams;

import java.nio.ByteBuffer;
import java.util.Map;
import java.util.concurrent.atomic.LongAdder;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The running-totals benchmark's Kafka Streams contender (benchmarks/stateful.py --stateful totals):
 * each customer's orders since the start, as processors/running_totals.py says in Structured
 * Streaming's words (groupBy(customer).agg(count, sum(amount), max(amount)), update mode).
 *
 * <pre>
 * input (byte[] key, schemaless Avro Order)
 *   -> decode, keep amount > 0, key = customer_id     [CustomerTotals.KeyByCustomer]
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

    static final LongAdder EMITTED = new LongAdder();

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
        Schema inSchema = StreamsApp.schema(args, "input-schema"), outSchema = StreamsApp.schema(args, "output-schema");

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args.get("input"), Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
               .process(() -> new CustomerTotals.KeyByCustomer(inSchema))     // (amount, items), amount > 0
               .groupByKey(Grouped.with("by-customer", Serdes.String(), Serdes.ByteArray()))
               .aggregate(() -> new byte[24],
                          (customer, order, totals) -> add(totals, ByteBuffer.wrap(order).getDouble()),
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
                   EMITTED.increment();
                   return KeyValue.pair(customer, StreamsApp.avro(outSchema, out));
               })
               .to(args.get("output"), Produced.with(Serdes.String(), Serdes.ByteArray()));
        StreamsApp.run(builder.build(), StreamsApp.properties(args),
                       () -> String.format("%d records read, %d totals emitted", CustomerTotals.READ.sum(),
                                           EMITTED.sum()));
    }
}
