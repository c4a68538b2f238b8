package txstream.bench.kstreams;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Supplier;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;

/**
 * What both contenders share: their command line, their settings, and how they run: until SIGTERM (the harness stops them once their output is complete),
 * state changes on stderr, a failed stream thread shuts the client down and the process exits
 * non-zero; the shutdown hook closes KafkaStreams cleanly and prints `counts` before and after.
 */
final class StreamsApp {

    private StreamsApp() {
    }

    static final long STARTED = System.nanoTime();

    /** The running client, for a contender's counts line (e.g. CurrencyWindows' dropped records). */
    static volatile KafkaStreams current;

    /** The Avro schema in the file the option `name` names. */
    static Schema schema(Map<String, String> args, String name) throws IOException {
        return new Schema.Parser().parse(new File(args.get(name)));
    }

    /** A record as schemaless Avro bytes (what the harness decodes). */
    static byte[] avro(Schema schema, GenericRecord record) {
        ByteArrayOutputStream buffer = new ByteArrayOutputStream(64);
        BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(buffer, null);
        try {
            new GenericDatumWriter<GenericRecord>(schema).write(record, encoder);
            encoder.flush();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return buffer.toByteArray();
    }

    static double seconds() {
        return (System.nanoTime() - STARTED) / 1e9;
    }

    static Map<String, String> parseArgs(String[] args) {
        Map<String, String> out = new HashMap<>();
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (!a.startsWith("--") || i + 1 >= args.length) {
                throw new IllegalArgumentException("expected --option value pairs, got " + a);
            }
            out.put(a.substring(2), args[++i]);
        }
        for (String required : new String[] {"bootstrap-servers", "input", "output", "application-id",
                                             "state-dir", "input-schema", "output-schema"}) {
            if (!out.containsKey(required)) {
                throw new IllegalArgumentException("--" + required + " is required");
            }
        }
        return out;
    }

    /** exactly_once_v2, the run's group as application.id, commit.interval.ms at its exactly-once default (100 ms). */
    static Properties properties(Map<String, String> args) {
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args.get("application-id"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.get("bootstrap-servers"));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, args.getOrDefault("threads", "2"));
        props.put(StreamsConfig.STATE_DIR_CONFIG, args.get("state-dir"));
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        return props;
    }

    static void run(Topology topology, Properties props, Supplier<String> counts) throws InterruptedException {
        KafkaStreams streams = new KafkaStreams(topology, props);
        current = streams;
        CountDownLatch finished = new CountDownLatch(1);
        AtomicBoolean stopping = new AtomicBoolean(false);
        AtomicBoolean failed = new AtomicBoolean(false);
        streams.setStateListener((now, before) -> {
            System.err.printf("kafka-streams: %s -> %s after %.1fs%n", before, now, seconds());
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                finished.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            System.err.println("kafka-streams: stream thread failed: " + e);
            e.printStackTrace();
            failed.set(true);
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stopping.set(true);
            System.err.printf("kafka-streams: stopping after %.1fs (%s)%n", seconds(), counts.get());
            streams.close(Duration.ofSeconds(15));
            System.err.printf("kafka-streams: closed (%s)%n", counts.get());
            finished.countDown();
        }, "kafka-streams-shutdown"));

        System.err.println("kafka-streams: " + topology.describe().toString().trim().replace('\n', ' '));
        streams.start();
        finished.await();
        if (!stopping.get()) {  // stopped by itself: a failure (it runs until SIGTERM otherwise)
            streams.close(Duration.ofSeconds(15));
            System.exit(failed.get() ? 1 : 2);
        }
    }
}
