package io.backfill.harness;

import java.time.Duration;
import java.util.Properties;

import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;

/**
 * A live Kafka Streams application that re-keys before a windowed count: clicks per page and minute
 * ({@code groupBy} the click's page, {@code /login} mapped to a null key, which the repartition drops), a
 * tumbling 1 min window with a grace of one day (nothing is late, so every update is independent of how the
 * repartition topic interleaves its writers), cache off: every update is emitted.
 *
 * <p>The repartition topic is {@code <application-id>-by-page-repartition} (the {@link Grouped} name); its
 * partition count is the input topic's. Output: key {@code page@window-start}, value the count, as strings.
 *
 * <p>Arguments: bootstrap application-id input-topic output-topic state-dir. Prints {@code RUNNING} once the
 * application runs; SIGTERM closes it cleanly and prints {@code CLOSED}.
 */
public final class LiveRekey {
    private LiveRekey() {
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 5) {
            System.err.println("usage: LiveRekey bootstrap application-id input output state-dir");
            System.exit(2);
        }
        Live.runUntilClosed(new KafkaStreams(topology(args[2], args[3]), props(args[0], args[1], args[4])));
    }

    /** Two stream threads, cache off, from the earliest offsets; repartition topics kept for the test to read. */
    static Properties props(String bootstrap, String applicationId, String stateDir) {
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 2);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 500);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        // keep what the repartition topic received (Kafka Streams deletes consumed records every 30 s)
        props.put(StreamsConfig.REPARTITION_PURGE_INTERVAL_MS_CONFIG, Duration.ofDays(1).toMillis());
        return props;
    }

    static org.apache.kafka.streams.Topology topology(String input, String output) {
        StreamsBuilder builder = new StreamsBuilder();
        Serde<String> text = Serdes.String();
        builder.stream(input, Consumed.with(text, text))
            .groupBy((key, click) -> page(click), Grouped.with("by-page", text, text))
            .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMinutes(1), Duration.ofDays(1)))
            .count(Materialized.with(text, Serdes.Long()))
            .toStream()
            .map((windowed, n) -> KeyValue.pair(windowed.key() + "@" + windowed.window().start(), Long.toString(n)))
            .to(output, Produced.with(text, text));
        return builder.build();
    }

    /** The click's page; none for /login or a click without one (a null key: dropped before the topic). */
    static String page(String click) {
        String page = click == null ? null : FlatJson.text(click, "page");
        return "/login".equals(page) ? null : page;
    }
}
