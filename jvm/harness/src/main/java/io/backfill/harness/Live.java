package io.backfill.harness;

import java.time.Duration;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.WindowedSerdes;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;

/**
 * A live Kafka Streams application with the demo job's {@code clicks_per_user_1m} operator, run against a
 * real broker: clicks per user and minute (tumbling 1 min, grace 10 s), with the number of clicks, the sum
 * of {@code amount} (null when no click had one) and the fold of the first letter of each page
 * ({@code '-'} for a click without a page), emitted once per window when it closes
 * ({@code suppress(untilWindowCloses)}). Cache off, as backfill assumes.
 *
 * <p>Output: the key as {@link WindowedSerdes#timeWindowedSerdeFrom} writes it (the user id, then the window
 * start as 8 bytes), the value a JSON object {@code {"clicks": n, "amount": x, "pages": "..."}}.
 *
 * <p>With the argument {@code sessions}, the demo job's {@code user_sessions} operator instead: sessions of
 * each user's clicks (gap 30 s, grace 10 s) with the same three values (two sessions merged: counts and
 * amounts added, the earlier session's pages first), released by {@code suppress(untilWindowCloses)}, the key
 * as {@link WindowedSerdes#sessionWindowedSerdeFrom} writes it (the user id, then the end and the start).
 *
 * <p>Arguments: bootstrap application-id input-topic output-topic state-dir
 * [at_least_once|exactly_once_v2] [commit-interval-ms] [halt-after-n-records] [windows|sessions]. Prints {@code RUNNING} once
 * the application is running; SIGTERM closes it cleanly (its offsets committed, its state checkpointed) and prints {@code CLOSED}.
 * With halt-after-n-records, the instance prints {@code AT partition offset} for each record it starts to
 * process, and halts the JVM (no shutdown hook, no commit, no close: a crash) when the n-th record arrives,
 * after printing {@code HALT partition offset} for it (that record is not processed). Before the halt it
 * waits one second, so what the producer had already been handed (outputs, changelog writes) reaches the
 * broker and the test knows exactly which records the crashed instance applied to its state.
 */
public final class Live {
    private static final Duration SIZE = Duration.ofMinutes(1);
    private static final Duration GRACE = Duration.ofSeconds(10);
    private static final Duration GAP = Duration.ofSeconds(30);

    private Live() {
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 5) {
            System.err.println("usage: Live bootstrap application-id input output state-dir [guarantee] [commit-ms] "
                + "[halt-after]");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, args.length > 5 ? args[5] : "at_least_once");
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, args.length > 6 ? args[6] : "1000");
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        // a restarted instance rejoins at once instead of waiting for the old member's session to expire
        props.put(StreamsConfig.consumerPrefix("session.timeout.ms"), 6000);
        props.put(StreamsConfig.consumerPrefix("heartbeat.interval.ms"), 1000);

        long haltAfter = args.length > 7 ? Long.parseLong(args[7]) : 0;
        boolean sessions = args.length > 8 && args[8].equals("sessions");
        runUntilClosed(new KafkaStreams(sessions ? sessionTopology(args[2], args[3], haltAfter)
            : topology(args[2], args[3], haltAfter), props));
    }

    /**
     * Start the application, print {@code RUNNING} once it runs, exit 1 if it fails; on SIGTERM close it
     * cleanly (offsets committed, state checkpointed), print {@code CLOSED} and return.
     */
    static void runUntilClosed(KafkaStreams streams) throws InterruptedException {
        CountDownLatch closed = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
                System.out.println("RUNNING");
                System.out.flush();
            }
            if (now == KafkaStreams.State.ERROR) {
                System.err.println("the application failed (state ERROR)");
                System.exit(1);
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            boolean clean = streams.close(Duration.ofSeconds(30));
            System.out.println(clean ? "CLOSED" : "CLOSE TIMED OUT");
            System.out.flush();
            closed.countDown();
        }));
        streams.start();
        closed.await();
    }

    static org.apache.kafka.streams.Topology topology(String input, String output, long haltAfter) {
        StreamsBuilder builder = new StreamsBuilder();
        Serde<String> text = Serdes.String();
        AtomicLong seen = new AtomicLong();
        builder.stream(input, Consumed.with(text, text))
            .processValues(() -> new Crash<>(haltAfter, seen))
            .groupByKey()
            .windowedBy(TimeWindows.ofSizeAndGrace(SIZE, GRACE))
            .aggregate(() -> "0\t\t", (key, click, acc) -> add(acc, click), Materialized.with(text, text))
            .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
            .toStream()
            .mapValues(Live::json)
            .to(output, Produced.with(WindowedSerdes.timeWindowedSerdeFrom(String.class, SIZE.toMillis()), text));
        return builder.build();
    }

    static org.apache.kafka.streams.Topology sessionTopology(String input, String output, long haltAfter) {
        StreamsBuilder builder = new StreamsBuilder();
        Serde<String> text = Serdes.String();
        AtomicLong seen = new AtomicLong();
        builder.stream(input, Consumed.with(text, text))
            .processValues(() -> new Crash<>(haltAfter, seen))
            .groupByKey()
            .windowedBy(SessionWindows.ofInactivityGapAndGrace(GAP, GRACE))
            .aggregate(() -> "0\t\t", (key, click, acc) -> add(acc, click), (key, a, b) -> merge(a, b),
                Materialized.with(text, text))
            .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
            .toStream()
            .mapValues(v -> v == null ? null : json(v))
            .to(output, Produced.with(WindowedSerdes.sessionWindowedSerdeFrom(String.class), text));
        return builder.build();
    }

    /** Two sessions' aggregates merged: counts and amounts added, the earlier session's pages first. */
    static String merge(String earlier, String later) {
        String[] a = earlier.split("\t", -1);
        String[] b = later.split("\t", -1);
        String amount = a[1].isEmpty() ? b[1] : b[1].isEmpty() ? a[1]
            : Double.toString(Double.parseDouble(a[1]) + Double.parseDouble(b[1]));
        return (Long.parseLong(a[0]) + Long.parseLong(b[0])) + "\t" + amount + "\t" + a[2] + b[2];
    }

    /** Passes records on; with a halt point, says where each record came from and crashes at the n-th. */
    static final class Crash<K, V> implements FixedKeyProcessor<K, V, V> {
        private final long haltAfter;
        private final AtomicLong seen;
        private FixedKeyProcessorContext<K, V> context;

        Crash(long haltAfter, AtomicLong seen) {
            this.haltAfter = haltAfter;
            this.seen = seen;
        }

        @Override
        public void init(FixedKeyProcessorContext<K, V> context) {
            this.context = context;
        }

        @Override
        public void process(FixedKeyRecord<K, V> record) {
            if (haltAfter > 0) {
                String where = context.recordMetadata().map(m -> m.partition() + " " + m.offset()).orElse("? ?");
                if (seen.incrementAndGet() >= haltAfter) {
                    System.out.println("HALT " + where);
                    System.out.flush();
                    try {
                        Thread.sleep(1000);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                    Runtime.getRuntime().halt(137);
                }
                System.out.println("AT " + where);
            }
            context.forward(record);
        }
    }

    /** The aggregate "clicks TAB amount-or-empty TAB pages" after one more click. */
    static String add(String acc, String click) {
        String[] a = acc.split("\t", -1);
        long clicks = Long.parseLong(a[0]) + 1;
        String amount = a[1];
        String pages = a[2];
        if (click != null) {
            String page = FlatJson.text(click, "page");
            Double x = FlatJson.number(click, "amount");
            if (x != null) {
                amount = Double.toString(amount.isEmpty() ? x : Double.parseDouble(amount) + x);
            }
            // substr(page, 2, 1): the character after the leading '/', '' for a shorter page
            pages += page == null ? "-" : page.length() > 1 ? page.substring(1, 2) : "";
        } else {
            pages += "-";
        }
        return clicks + "\t" + amount + "\t" + pages;
    }

    static String json(String acc) {
        String[] a = acc.split("\t", -1);
        return String.format(Locale.ROOT, "{\"clicks\": %s, \"amount\": %s, \"pages\": \"%s\"}", a[0],
            a[1].isEmpty() ? "null" : a[1], a[2].replace("\\", "\\\\").replace("\"", "\\\""));
    }
}
