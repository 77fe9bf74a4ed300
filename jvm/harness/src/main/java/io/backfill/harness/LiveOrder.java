package io.backfill.harness;

import java.io.BufferedWriter;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.processor.TimestampExtractor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;

/**
 * A live Kafka Streams application that says in which order its tasks process their records: the judge of
 * backfill's merge order (backfill/conformance/order.py).
 *
 * <p>Two sub-topologies: topics {@code a} and {@code b} read through one source node
 * ({@code builder.stream(List.of(a, b))}), and, when given, topics {@code c} and {@code d}, each its own
 * source node, in a stream-stream join. Every task of either reads one partition of each of its two topics.
 * The event time is the value's field {@code t} (a JSON object {@code {"t": N}}); a negative one is invalid:
 * the extractor returns it and the record is skipped ({@code skip}), or it returns the partition time
 * ({@code partition_time}).
 *
 * <p>Arguments: bootstrap application-id state-dir policy a b [c d] [property=value ...] (consumer or
 * Streams settings, e.g. {@code max.poll.records=10}). Prints {@code RUNNING} once running, then
 * {@code P task topic partition offset} for each record as its task takes it, before anything else is done
 * with it. SIGTERM closes the application.
 */
public final class LiveOrder {
    private LiveOrder() {
    }

    public static void main(String[] args) throws InterruptedException {
        // the report owns stdout: whatever else prints there (a library, a shutdown hook) goes to stderr, so no
        // line of the report is ever cut by another thread's output
        System.setOut(System.err);
        if (args.length < 6) {
            System.err.println("usage: LiveOrder bootstrap application-id state-dir skip|partition_time a b [c d] "
                + "[property=value ...]");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[2]);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.DEFAULT_TIMESTAMP_EXTRACTOR_CLASS_CONFIG,
            "partition_time".equals(args[3]) ? FieldTimeOrPartitionTime.class : FieldTime.class);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        List<String> topics = new java.util.ArrayList<>();
        for (int i = 4; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq > 0) {
                props.put(args[i].substring(0, eq), args[i].substring(eq + 1));
            } else {
                topics.add(args[i]);
            }
        }
        Live.runUntilClosed(new KafkaStreams(topology(topics), props));
    }

    static org.apache.kafka.streams.Topology topology(List<String> topics) {
        StreamsBuilder builder = new StreamsBuilder();
        Serde<byte[]> bytes = Serdes.ByteArray();
        Consumed<byte[], byte[]> consumed = Consumed.with(bytes, bytes);
        builder.stream(List.of(topics.get(0), topics.get(1)), consumed).processValues(Report::new)
            .foreach((k, v) -> { });
        if (topics.size() >= 4) {
            KStream<byte[], byte[]> left = builder.stream(topics.get(2), consumed).processValues(Report::new);
            KStream<byte[], byte[]> right = builder.stream(topics.get(3), consumed).processValues(Report::new);
            left.join(right, (x, y) -> x, JoinWindows.ofTimeDifferenceWithNoGrace(Duration.ofMillis(5)),
                    StreamJoined.with(bytes, bytes, bytes))
                .foreach((k, v) -> { });
        }
        return builder.build();
    }

    /** The value's field {@code t}; a negative or missing one is invalid and returned as it is (skipped). */
    public static class FieldTime implements TimestampExtractor {
        @Override
        public long extract(ConsumerRecord<Object, Object> record, long partitionTime) {
            return field(record);
        }

        static long field(ConsumerRecord<Object, Object> record) {
            Object value = record.value();
            if (!(value instanceof byte[])) {
                return -1;
            }
            Double t = FlatJson.number(new String((byte[]) value, StandardCharsets.UTF_8), "t");
            return t == null ? -1 : t.longValue();
        }
    }

    /** As {@link FieldTime}, with the partition time for an invalid one (UsePartitionTimeOnInvalidTimestamp). */
    public static class FieldTimeOrPartitionTime implements TimestampExtractor {
        @Override
        public long extract(ConsumerRecord<Object, Object> record, long partitionTime) {
            return Topologies.orPartitionTime(FieldTime.field(record), partitionTime);
        }
    }

    /** Prints where each record came from as its task takes it, then passes it on. */
    static final class Report implements FixedKeyProcessor<byte[], byte[], byte[]> {
        private static final BufferedWriter OUT = new BufferedWriter(
            new OutputStreamWriter(new FileOutputStream(FileDescriptor.out), StandardCharsets.UTF_8), 1 << 16);
        private FixedKeyProcessorContext<byte[], byte[]> context;

        static {
            Thread flusher = new Thread(() -> {
                while (true) {
                    try {
                        Thread.sleep(200);
                        synchronized (OUT) {
                            OUT.flush();
                        }
                    } catch (InterruptedException e) {
                        return;
                    } catch (IOException e) {
                        throw new UncheckedIOException(e);
                    }
                }
            });
            flusher.setDaemon(true);
            flusher.start();
        }

        @Override
        public void init(FixedKeyProcessorContext<byte[], byte[]> context) {
            this.context = context;
        }

        @Override
        public void process(FixedKeyRecord<byte[], byte[]> record) {
            String where = context.recordMetadata().map(m -> m.topic() + "\t" + m.partition() + "\t" + m.offset())
                .orElse("?\t?\t?");
            synchronized (OUT) {
                try {
                    OUT.write("P\t" + context.taskId() + "\t" + where + "\t" + record.timestamp() + "\n");
                } catch (IOException e) {
                    throw new UncheckedIOException(e);
                }
            }
            context.forward(record);
        }
    }
}
