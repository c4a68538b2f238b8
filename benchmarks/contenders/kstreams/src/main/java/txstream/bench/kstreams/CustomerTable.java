package txstream.bench.kstreams;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Map;
import java.util.concurrent.atomic.LongAdder;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.DecoderFactory;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.GlobalKTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The table-join benchmark's Kafka Streams contender (benchmarks/tables.py): each order with its
 * customer's name and tier, as processors/orders_with_customer_table.py says in Spark's words
 * (orders.join(customers, value.customer_id == customer, "left")).
 *
 * <pre>
 * customers (compacted, key = customer_id, schemaless Avro Customer) -> GlobalKTable
 *   (every instance restores the whole table into its RocksDB store before processing)
 * orders (byte[] key, schemaless Avro Order)
 *   -> leftJoin(customers, key = the order's customer_id)
 *   -> OrderWithCustomer (schemas/order_with_customer.avsc) -> output (same key)
 * </pre>
 *
 * A GlobalKTable, Kafka Streams' broadcast table: no repartition of the orders (they are keyed by
 * order id). exactly_once_v2, 2 stream threads, commit.interval.ms 100. Runs until SIGTERM.
 */
public final class CustomerTable {

    private CustomerTable() {
    }

    static final LongAdder READ = new LongAdder();
    static final LongAdder EMITTED = new LongAdder();

    static GenericRecord decode(GenericDatumReader<GenericRecord> reader, byte[] value) {
        try {
            return reader.read(null, DecoderFactory.get().binaryDecoder(value, null));
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = StreamsApp.parseArgs(argv);
        Schema inSchema = StreamsApp.schema(args, "input-schema"), outSchema = StreamsApp.schema(args, "output-schema");
        Schema tableSchema = StreamsApp.schema(args, "table-schema");
        ThreadLocal<GenericDatumReader<GenericRecord>> orders =
            ThreadLocal.withInitial(() -> new GenericDatumReader<>(inSchema));
        ThreadLocal<GenericDatumReader<GenericRecord>> customers =
            ThreadLocal.withInitial(() -> new GenericDatumReader<>(tableSchema));

        StreamsBuilder builder = new StreamsBuilder();
        GlobalKTable<String, byte[]> table = builder.globalTable(
            args.get("table"), Consumed.with(Serdes.String(), Serdes.ByteArray()),
            Materialized.<String, byte[], KeyValueStore<Bytes, byte[]>>as("customers")
                        .withKeySerde(Serdes.String()).withValueSerde(Serdes.ByteArray()));
        builder.stream(args.get("input"), Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
               .mapValues(value -> {
                   READ.increment();
                   return decode(orders.get(), value);
               })
               .leftJoin(table, (key, order) -> order.get("customer_id").toString(), (order, customer) -> {
                   GenericRecord out = new GenericData.Record(outSchema);
                   out.put("id", order.get("id").toString());
                   out.put("customer_id", order.get("customer_id").toString());
                   out.put("amount", order.get("amount"));
                   if (customer != null) {
                       GenericRecord c = decode(customers.get(), customer);
                       out.put("name", c.get("name").toString());
                       out.put("tier", c.get("tier").toString());
                   }
                   EMITTED.increment();
                   return StreamsApp.avro(outSchema, out);
               })
               .to(args.get("output"), Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
        StreamsApp.run(builder.build(), StreamsApp.properties(args),
                       () -> String.format("%d records read, %d orders emitted", READ.sum(), EMITTED.sum()));
    }
}
