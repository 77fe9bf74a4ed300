package io.backfill.harness;

import java.time.Duration;
import java.util.Properties;

import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.WindowedSerdes;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;

/**
 * The demo job's {@code clicks_per_user_1m} aggregate as a production application runs it: every update
 * (no suppress), the record cache on ({@code statestore.cache.max.bytes}) and a commit interval, so the store
 * forwards a window's value only when the cache flushes (a commit, an eviction, the close). Key and value as
 * {@link Live} writes them.
 *
 * <p>Arguments: bootstrap application-id input-topic output-topic state-dir cache-bytes commit-interval-ms.
 * Prints {@code RUNNING} once running and {@code AT partition offset} for each record it processes (so a test
 * knows when everything produced was processed); SIGTERM closes it cleanly, which flushes the cache, and
 * prints {@code CLOSED}.
 */
public final class LiveCached {
    private static final Duration SIZE = Duration.ofMinutes(1);
    private static final Duration GRACE = Duration.ofSeconds(10);

    private LiveCached() {
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 7) {
            System.err.println("usage: LiveCached bootstrap application-id input output state-dir cache-bytes commit-ms");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, Long.parseLong(args[5]));
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.parseLong(args[6]));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        Live.runUntilClosed(new KafkaStreams(topology(args[2], args[3]), props));
    }

    static org.apache.kafka.streams.Topology topology(String input, String output) {
        StreamsBuilder builder = new StreamsBuilder();
        Serde<String> text = Serdes.String();
        builder.stream(input, Consumed.with(text, text))
            .processValues(Where::new)
            .groupByKey()
            .windowedBy(TimeWindows.ofSizeAndGrace(SIZE, GRACE))
            .aggregate(() -> "0\t\t", (key, click, acc) -> Live.add(acc, click), Materialized.with(text, text))
            .toStream()
            .mapValues(Live::json)
            .to(output, Produced.with(WindowedSerdes.timeWindowedSerdeFrom(String.class, SIZE.toMillis()), text));
        return builder.build();
    }

    /** Says where each record came from, and passes it on. */
    static final class Where<K, V> implements FixedKeyProcessor<K, V, V> {
        private FixedKeyProcessorContext<K, V> context;

        @Override
        public void init(FixedKeyProcessorContext<K, V> context) {
            this.context = context;
        }

        @Override
        public void process(FixedKeyRecord<K, V> record) {
            System.out.println("AT " + context.recordMetadata().map(m -> m.partition() + " " + m.offset()).orElse("? ?"));
            context.forward(record);
        }
    }
}
