package io.backfill.harness;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.kstream.Aggregator;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Initializer;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Merger;
import org.apache.kafka.streams.kstream.SessionWindowedKStream;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.SlidingWindows;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindowedKStream;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.ValueJoiner;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.test.TestRecord;

/**
 * Replays scenarios through Kafka Streams' own TopologyTestDriver, one driver per (scenario, task), and
 * prints what the topology forwarded and how many records its task dropped.
 *
 * Input (stdin, tab-separated, \N for null):
 *   S id agg size advance grace emit(updates|final|close) [aggregator [retention]]
 *                       emit: every update, suppress(untilWindowCloses), or emitStrategy(onWindowClose());
 *                       aggregator: count|sum of n|fold of p (default), count, or concat:INIT (acc + '+' + value)
 *                       retention: the window store's, in ms (default: size + grace, Kafka Streams' own default)
 *   S id sess gap grace emit(updates|final|close)    session windows, count|sum of n|fold of p, merged
 *                       field by field (count + count | sum + sum | fold . fold)
 *   S id slide diff grace emit(updates|final|close) [retention]  sliding windows, count|sum of n|fold of p;
 *                       retention: the window store's, in ms (default: 2 diff + grace, Kafka Streams' own)
 *   P invalid 0|1|2                                        timestamps: the record's (0), else the value's third
 *                       field (n,p,t), an invalid one (negative, missing) skipped (1) or the partition time (2)
 *   P cache bytes | P commit ms                            the record cache (statestore.cache.max.bytes; 0, the
 *                       default, turns caching off) and commit.interval.ms for the scenarios below
 *   S id join how(inner|left|outer) before after grace eager(0|1) [joiner]
 *                       joiner: l|r with '-' for a missing side (default), or plus (String(l) + '+' + String(r))
 *   S id tjoin how(inner|left) history grace filter    stream "left" joined with table "right" (KStream#join /
 *                       leftJoin(KTable)); history: -1 for a plain store, else a versioned store keeping that
 *                       much history (Stores.persistentVersionedKeyValueStore, 3.5+); grace: the join's
 *                       (Joined#withGracePeriod, 3.6+; 0: none); filter: '-' or a text: stream records whose
 *                       value contains it (or is null) never reach the join (KStream#filter); [rekey]: '-',
 *                       or val: the stream re-keyed before the join (KStream#selectKey, a repartition topic)
 *                       to one of the three keys its key holds, the one its value's number picks (l7: the
 *                       second, 7 % 3; a null value: a null key)
 *   S id tagg aggregator filter                       groupByKey().aggregate without a window: count|sum of n|
 *                       fold of p (ours), or tomb (a fold of p whose step gives null when p is z: a delete);
 *                       filter as for tjoin, over the p of the value
 *   S id agg ... [aggregator [retention [filter]]]   a window aggregate after KStream#filter, as for tjoin
 *   S id chain up(tjoin|sjoin|agg|sess|slide|rtjoin|atjoin|atself|ttjoin|ajoin|sjt|tsj|asj) how size advance grace before after joingrace   an operator reading
 *                       what another forwards, in one task (Topologies#chain); how, before, after, joingrace: the join's
 *                       (up agg, sess, slide: how is -, suppress or close, the upstream's emit; size the gap or
 *                       time difference)
 *   T task                                                 a task: the records below, in processing order
 *   R side(L|R|T|-) key value ts                           value: n,p for aggregates (n may be \N)
 *   E                                                      end of the task: replay it
 * Output (stdout): V version; O id task key start end value ts; K id task index n: the task's dropped-record
 *                       metric rose by n while the record at that index (0-based, in input order) was processed;
 *                       W id task index start end streamTime: Kafka Streams' skipped-record log refused the
 *                       record at that index for the window [start, end] at that stream time (SkipLog);
 *                       D id task dropped; X id task message.
 *
 * <p>The driver commits after every input record, and a commit flushes the record cache: with the cache on,
 * only the updates made while processing one record are coalesced, and what a flush forwards carries the
 * context of the record that wrote it last.
 */
public final class Replay {
    private static final String NULL = "\\N";
    private static final ValueJoiner<String, String, String> JOINER =
        (l, r) -> (l == null ? "-" : l) + "|" + (r == null ? "-" : r);
    private static final ValueJoiner<String, String, String> PLUS = (l, r) -> l + "+" + r;
    // Kafka Streams' words for a refused window: [start,end) for time windows, [start,end] for sessions and sliding
    private static final Pattern EXPIRED =
        Pattern.compile("window=\\[(-?\\d+),(-?\\d+)[)\\]] expiration=\\[-?\\d+\\] streamTime=\\[(-?\\d+)\\]");

    private Replay() {
    }

    public static void main(String[] args) throws IOException, InterruptedException {
        Path stateRoot = Files.createTempDirectory("backfill-harness-");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintWriter out = new PrintWriter(new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8)));
        out.println("V\t" + kafkaVersion());
        // tasks are independent (each its own driver and state directory): replay them on every core, print in order
        int threads = Integer.getInteger("backfill.threads", Runtime.getRuntime().availableProcessors());
        ExecutorService pool = Executors.newFixedThreadPool(Math.max(1, threads));
        List<Future<String>> results = new ArrayList<>();
        String[] scenario = null;
        String task = null;
        Map<String, Long> settings = new java.util.HashMap<>(Map.of("cache", 0L, "commit", 30_000L, "invalid", 0L));
        List<String[]> records = new ArrayList<>();
        String line;
        try {
            while ((line = in.readLine()) != null) {
                if (line.isEmpty()) {
                    continue;
                }
                String[] f = line.split("\t", -1);
                switch (f[0]) {
                    case "S" -> scenario = f;
                    case "P" -> settings.put(f[1], Long.parseLong(f[2]));
                    case "T" -> { task = f[1]; records = new ArrayList<>(); }
                    case "R" -> records.add(f);
                    case "E" -> {
                        String[] s = scenario;
                        String t = task;
                        List<String[]> rs = records;
                        Path dir = stateRoot.resolve(Integer.toString(results.size()));
                        long cache = settings.get("cache");
                        long commit = settings.get("commit");
                        long invalid = settings.get("invalid");
                        results.add(pool.submit(() -> replayed(s, t, rs, dir, cache, commit, invalid)));
                    }
                    default -> throw new IllegalArgumentException("unknown line: " + line);
                }
            }
            for (Future<String> result : results) {
                try {
                    out.print(result.get());
                } catch (ExecutionException e) {
                    throw new IllegalStateException(e.getCause());
                }
            }
        } finally {
            pool.shutdownNow();
            out.flush();
            deleteTree(stateRoot);
        }
    }

    /** One task's output lines, or its error as an X line. */
    private static String replayed(String[] scenario, String task, List<String[]> records, Path stateDir,
                                   long cache, long commit, long invalid) {
        StringWriter text = new StringWriter();
        PrintWriter out = new PrintWriter(text);
        try {
            replay(scenario, task, records, stateDir, out, cache, commit, invalid);
        } catch (RuntimeException e) {
            out.println("X\t" + scenario[1] + "\t" + task + "\t" + oneLine(e));
        }
        out.flush();
        return text.toString();
    }

    private static void replay(String[] s, String task, List<String[]> records, Path stateDir, PrintWriter out,
                               long cache, long commit, long invalid) {
        boolean agg = !s[2].equals("join") && !s[2].equals("tjoin") && !s[2].equals("tagg");
        boolean twoTopics = s[2].equals("join") || s[2].equals("tjoin") || s[2].equals("chain");
        boolean cached = cache > 0;
        StreamsBuilder builder = new StreamsBuilder();
        if (s[2].equals("tjoin")) {
            Topologies.tableJoin(builder, s[3], Long.parseLong(s[4]), Long.parseLong(s[5]), s[6],
                s.length > 7 ? s[7] : "-", JOINER);
        } else if (s[2].equals("chain")) {
            Topologies.chain(builder, s[3], s[4], Long.parseLong(s[5]), Long.parseLong(s[6]), Long.parseLong(s[7]),
                Long.parseLong(s[8]), Long.parseLong(s[9]), Long.parseLong(s[10]));
        } else if (s[2].equals("tagg")) {
            Topologies.tableAggregate(builder, s[3], s[4]);
        } else if (s[2].equals("sess")) {
            sessions(builder, Long.parseLong(s[3]), Long.parseLong(s[4]), s[5], cached);
        } else if (s[2].equals("slide")) {
            sliding(builder, Long.parseLong(s[3]), Long.parseLong(s[4]), s[5], s.length > 6 ? Long.parseLong(s[6]) : -1,
                cached);
        } else if (agg) {
            aggregate(builder, Long.parseLong(s[3]), Long.parseLong(s[4]), Long.parseLong(s[5]), s[6],
                s.length > 7 ? s[7] : "ours", s.length > 8 ? Long.parseLong(s[8]) : -1, s.length > 9 ? s[9] : "-",
                cached);
        } else {
            join(builder, s[3], Long.parseLong(s[4]), Long.parseLong(s[5]), Long.parseLong(s[6]), s[7].equals("1"),
                s.length > 8 && s[8].equals("plus") ? PLUS : JOINER);
        }
        Topology topology = builder.build();
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "backfill-conformance");
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, "unused:9092");
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
        props.put("statestore.cache.max.bytes", Long.toString(cache));  // 0: caching off, backfill's default
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.toString(commit));
        if (invalid > 0) {  // the timestamp is the value's third field; an invalid one skipped, or the partition time
            props.put(StreamsConfig.DEFAULT_TIMESTAMP_EXTRACTOR_CLASS_CONFIG,
                invalid == 1 ? Topologies.ValueTime.class : Topologies.ValueTimeOrPartitionTime.class);
        }
        // every serde is given explicitly; 3.6 and 3.7 still look for defaults in a stream-table join's grace buffer
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        // the wall-clock throttles of emit-on-close and of the outer join's non-joined rows, taken as 0 (the
        // driver's clock does not move; backfill has no wall clock either)
        props.put("__emit.interval.ms.kstreams.windowed.aggregation__", 0L);
        props.put("__emit.interval.ms.kstreams.outer.join.spurious.results.fix__", 0L);
        try (TopologyTestDriver driver = new TopologyTestDriver(topology, props, Instant.ofEpochMilli(0))) {
            StringSerializer ser = new StringSerializer();
            TestInputTopic<String, String> left = driver.createInputTopic("left", ser, ser);
            TestInputTopic<String, String> right = twoTopics ? driver.createInputTopic("right", ser, ser) : null;
            // a chain rtjoin's or ttjoin's second table (records T)
            TestInputTopic<String, String> third = s[2].equals("chain")
                && (s[3].equals("rtjoin") || s[3].equals("ttjoin") || s[3].equals("sjt") || s[3].equals("tsj"))
                ? driver.createInputTopic("third", ser, ser) : null;
            TestOutputTopic<String, String> output =
                driver.createOutputTopic("out", new StringDeserializer(), new StringDeserializer());
            long before = 0;
            List<String> heard = SkipLog.listen();
            for (int i = 0; i < records.size(); i++) {
                String[] r = records.get(i);
                TestInputTopic<String, String> topic = r[1].equals("R") ? right : r[1].equals("T") ? third : left;
                topic.pipeInput(new TestRecord<>(nullable(r[2]), nullable(r[3]), new RecordHeaders(), Long.parseLong(r[4])));
                // the windows the record was refused for, and the stream time then, as the skipped-record log says
                for (String said : heard) {
                    if (Boolean.getBoolean("backfill.debug")) System.err.println(said);
                    Matcher m = EXPIRED.matcher(said);
                    if (m.find()) {
                        out.println(String.join("\t", "W", s[1], task, Integer.toString(i), m.group(1), m.group(2),
                            m.group(3)));
                    }
                }
                heard.clear();
                // which record the task dropped, and how often (a windowed aggregate counts each window it refuses)
                long now = (long) dropped(driver.metrics());
                if (now > before) {
                    out.println(String.join("\t", "K", s[1], task, Integer.toString(i), Long.toString(now - before)));
                }
                before = now;
            }
            List<TestRecord<String, String>> forwarded = output.readRecordsToList();
            for (TestRecord<String, String> rec : forwarded) {
                String key = rec.key();
                String start = "-";
                String end = "-";
                if (agg) {  // the window travels in the key: key \t start \t end
                    String[] k = key.split("\t", -1);
                    key = k[0];
                    start = k[1];
                    end = k[2];
                }
                out.println(String.join("\t", "O", s[1], task, show(key), start, end, show(rec.value()),
                    Long.toString(rec.timestamp())));
            }
            out.println("D\t" + s[1] + "\t" + task + "\t" + (long) dropped(driver.metrics()));
        } finally {
            SkipLog.stop();
        }
    }

    private static void aggregate(StreamsBuilder builder, long size, long advance, long grace, String emit,
                                  String aggregator, long retention, String filter, boolean cached) {
        TimeWindows windows = TimeWindows.ofSizeAndGrace(Duration.ofMillis(size), Duration.ofMillis(grace))
            .advanceBy(Duration.ofMillis(advance));
        Initializer<String> init;
        Aggregator<String, String, String> step;
        if (aggregator.equals("count")) {
            init = () -> "0";
            step = (k, v, acc) -> Long.toString(Long.parseLong(acc) + 1);
        } else if (aggregator.startsWith("concat:")) {
            String first = aggregator.substring("concat:".length());
            init = () -> first;
            step = (k, v, acc) -> acc + "+" + v;
        } else {
            init = () -> "0|0|";
            step = Replay::step;
        }
        KStream<String, String> in = Topologies.filtered(
            builder.stream("left", Consumed.with(Serdes.String(), Serdes.String())), filter);
        TimeWindowedKStream<String, String> windowed = in
            .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
            .windowedBy(windows);
        if (emit.equals("close")) {
            windowed = windowed.emitStrategy(EmitStrategy.onWindowClose());
        }
        Materialized<String, String, WindowStore<Bytes, byte[]>> store = caching(Materialized
            .<String, String, WindowStore<Bytes, byte[]>>as("agg")
            .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()), cached);
        if (retention >= 0) {
            store = store.withRetention(Duration.ofMillis(retention));
        }
        KTable<Windowed<String>, String> table = windowed.aggregate(init, step, store);
        if (emit.equals("final")) {
            table = table.suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()));
        }
        table.toStream()
            .map((wk, v) -> KeyValue.pair(wk.key() + "\t" + wk.window().start() + "\t" + wk.window().end(), v))
            .to("out", Produced.with(Serdes.String(), Serdes.String()));
    }

    private static <S extends org.apache.kafka.streams.processor.StateStore> Materialized<String, String, S> caching(
            Materialized<String, String, S> store, boolean cached) {
        return cached ? store.withCachingEnabled() : store.withCachingDisabled();
    }

    private static void sessions(StreamsBuilder builder, long gap, long grace, String emit, boolean cached) {
        SessionWindowedKStream<String, String> windowed = grouped(builder)
            .windowedBy(SessionWindows.ofInactivityGapAndGrace(Duration.ofMillis(gap), Duration.ofMillis(grace)));
        if (emit.equals("close")) {
            windowed = windowed.emitStrategy(EmitStrategy.onWindowClose());
        }
        Merger<String, String> merge = (k, a, b) -> {
            String[] x = a.split("\\|", -1);
            String[] y = b.split("\\|", -1);
            return (Long.parseLong(x[0]) + Long.parseLong(y[0])) + "|" + (Long.parseLong(x[1]) + Long.parseLong(y[1]))
                + "|" + x[2] + y[2];
        };
        KTable<Windowed<String>, String> table = windowed.aggregate(() -> "0|0|", Replay::step, merge,
            caching(Materialized.<String, String, SessionStore<Bytes, byte[]>>as("agg")
                .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()), cached));
        emitWindowed(emit.equals("final")
            ? table.suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded())) : table);
    }

    private static void sliding(StreamsBuilder builder, long diff, long grace, String emit, long retention,
                                boolean cached) {
        TimeWindowedKStream<String, String> windowed = grouped(builder)
            .windowedBy(SlidingWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(diff), Duration.ofMillis(grace)));
        if (emit.equals("close")) {
            windowed = windowed.emitStrategy(EmitStrategy.onWindowClose());
        }
        Materialized<String, String, WindowStore<Bytes, byte[]>> store = caching(Materialized
            .<String, String, WindowStore<Bytes, byte[]>>as("agg")
            .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()), cached);
        if (retention >= 0) {
            store = store.withRetention(Duration.ofMillis(retention));
        }
        KTable<Windowed<String>, String> table = windowed.aggregate(() -> "0|0|", Replay::step, store);
        emitWindowed(emit.equals("final")
            ? table.suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded())) : table);
    }

    private static org.apache.kafka.streams.kstream.KGroupedStream<String, String> grouped(StreamsBuilder builder) {
        return builder.stream("left", Consumed.with(Serdes.String(), Serdes.String()))
            .groupByKey(Grouped.with(Serdes.String(), Serdes.String()));
    }

    /** The window travels in the key: key \t start \t end (a session's end is inclusive, as Kafka Streams has it). */
    private static void emitWindowed(KTable<Windowed<String>, String> table) {
        table.toStream()
            .map((wk, v) -> KeyValue.pair(wk.key() + "\t" + wk.window().start() + "\t" + wk.window().end(), v))
            .to("out", Produced.with(Serdes.String(), Serdes.String()));
    }

    /** count | sum of n (nulls ignored) | fold of p (a null value folds in "~"). */
    static String step(String key, String value, String acc) {
        String[] a = acc.split("\\|", -1);
        long count = Long.parseLong(a[0]) + 1;
        long sum = Long.parseLong(a[1]);
        String fold = a[2];
        if (value == null) {
            fold += "~";
        } else {
            String[] v = value.split(",", -1);
            if (!v[0].equals(NULL)) {
                sum += Long.parseLong(v[0]);
            }
            fold += v[1];
        }
        return count + "|" + sum + "|" + fold;
    }

    private static void join(StreamsBuilder builder, String how, long before, long after, long grace, boolean eager,
                             ValueJoiner<String, String, String> joiner) {
        JoinWindows windows;
        if (eager) {
            windows = oldJoinWindows(before, after, grace);
        } else {
            // either side may be negative (before + after >= 0): both set explicitly, the wider one first
            windows = JoinWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(Math.max(before, after)),
                Duration.ofMillis(grace)).before(Duration.ofMillis(before)).after(Duration.ofMillis(after));
        }
        KStream<String, String> left = builder.stream("left", Consumed.with(Serdes.String(), Serdes.String()));
        KStream<String, String> right = builder.stream("right", Consumed.with(Serdes.String(), Serdes.String()));
        StreamJoined<String, String, String> joined = StreamJoined.with(Serdes.String(), Serdes.String(), Serdes.String());
        KStream<String, String> result = switch (how) {
            case "inner" -> left.join(right, joiner, windows, joined);
            case "left" -> left.leftJoin(right, joiner, windows, joined);
            case "outer" -> left.outerJoin(right, joiner, windows, joined);
            default -> throw new IllegalArgumentException("unknown join: " + how);
        };
        result.to("out", Produced.with(Serdes.String(), Serdes.String()));
    }

    /** JoinWindows.of(after).before(before).grace(grace): the old, eager join windows (gone in Kafka Streams 4.0). */
    private static JoinWindows oldJoinWindows(long before, long after, long grace) {
        try {
            Method of = JoinWindows.class.getMethod("of", Duration.class);
            Method graceMethod = JoinWindows.class.getMethod("grace", Duration.class);
            JoinWindows w = ((JoinWindows) of.invoke(null, Duration.ofMillis(after))).before(Duration.ofMillis(before));
            return (JoinWindows) graceMethod.invoke(w, Duration.ofMillis(grace));
        } catch (ReflectiveOperationException e) {
            throw new UnsupportedOperationException("this Kafka Streams version has no JoinWindows.of (eager joins)");
        }
    }

    private static double dropped(Map<MetricName, ? extends Metric> metrics) {
        double total = 0;
        for (Map.Entry<MetricName, ? extends Metric> e : metrics.entrySet()) {
            MetricName n = e.getKey();
            if (n.name().equals("dropped-records-total") && n.group().equals("stream-task-metrics")) {
                total += ((Number) e.getValue().metricValue()).doubleValue();
            }
        }
        return total;
    }

    /** The version of the kafka-clients jar on the classpath (every Kafka jar of a release has the same). */
    private static String kafkaVersion() throws IOException {
        Properties p = new Properties();
        try (var stream = TopologyTestDriver.class.getClassLoader().getResourceAsStream("kafka/kafka-version.properties")) {
            if (stream != null) {
                p.load(stream);
            }
        }
        return p.getProperty("version", "unknown");
    }

    private static String nullable(String s) {
        return s.equals(NULL) ? null : s;
    }

    private static String show(String s) {
        return s == null ? NULL : s;
    }

    private static String oneLine(Throwable e) {
        Throwable root = e;
        while (root.getCause() != null) {
            root = root.getCause();
        }
        return (root.getClass().getSimpleName() + ": " + root.getMessage()).replace('\n', ' ').replace('\t', ' ');
    }

    private static void deleteTree(Path root) throws IOException {
        try (Stream<Path> paths = Files.walk(root)) {
            paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        }
    }
}
