package io.backfill.harness;

import java.lang.reflect.Method;
import java.time.Duration;

import java.nio.charset.StandardCharsets;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Aggregator;
import org.apache.kafka.streams.kstream.Initializer;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.SessionWindowedKStream;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.SlidingWindows;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindowedKStream;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.ValueJoiner;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.TimestampExtractor;
import org.apache.kafka.streams.state.KeyValueBytesStoreSupplier;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The topologies of Replay beyond one windowed operator: stream-table joins (plain and versioned tables),
 * table aggregations, KStream#filter before an operator, and chains (an operator reading what another
 * forwards). Built with the DSL only, as an application would.
 * APIs newer than the oldest version judged are called by reflection, so the harness still loads there and
 * reports the missing API as the scenario's error.
 */
final class Topologies {
    /** A re-keyed stream record's key holds three keys of this width; its value's number picks one. */
    static final int REKEY_WIDTH = 7;

    private Topologies() {
    }

    /** KStream#filter: drops records whose value is null or contains `text` ('-': no filter). */
    static KStream<String, String> filtered(KStream<String, String> in, String text) {
        if (text.equals("-")) {
            return in;
        }
        return in.filter((k, v) -> v != null && !v.contains(text));
    }

    static void tableJoin(StreamsBuilder builder, String how, long history, long grace, String filter,
                          String rekey, ValueJoiner<String, String, String> joiner) {
        KStream<String, String> stream = filtered(
            builder.stream("left", Consumed.with(Serdes.String(), Serdes.String())), filter);
        if (rekey.equals("val")) {  // selectKey: the join then reads a repartition topic
            stream = stream.selectKey((k, v) -> {
                if (v == null) {
                    return null;
                }
                int at = Integer.parseInt(v.substring(1)) % 3 * REKEY_WIDTH;
                return k.substring(at, at + REKEY_WIDTH);
            });
        }
        if (grace > 0 && how.equals("left")) {  // 3.7+ fails on a null key in the grace buffer: filtered first
            stream = stream.filter((k, v) -> k != null);
        }
        Materialized<String, String, KeyValueStore<Bytes, byte[]>> store = history < 0
            ? Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("table")
            : Materialized.<String, String>as(versionedStore(history));
        KTable<String, String> table = builder.table("right", Consumed.with(Serdes.String(), Serdes.String()),
            store.withKeySerde(Serdes.String()).withValueSerde(Serdes.String()).withCachingDisabled());
        Joined<String, String, String> joined = Joined.with(Serdes.String(), Serdes.String(), Serdes.String());
        if (grace > 0) {
            joined = withGrace(joined, grace);
        }
        KStream<String, String> result = switch (how) {
            case "inner" -> stream.join(table, joiner, joined);
            case "left" -> stream.leftJoin(table, joiner, joined);
            default -> throw new IllegalArgumentException("unknown stream-table join: " + how);
        };
        result.to("out", Produced.with(Serdes.String(), Serdes.String()));
    }

    static void tableAggregate(StreamsBuilder builder, String aggregator, String filter) {
        KStream<String, String> in = builder.stream("left", Consumed.with(Serdes.String(), Serdes.String()));
        in = filter.equals("-") ? in : in.filter((k, v) -> v != null && !v.split(",", -1)[1].equals(filter));
        Materialized<String, String, KeyValueStore<Bytes, byte[]>> store = Materialized
            .<String, String, KeyValueStore<Bytes, byte[]>>as("agg")
            .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()).withCachingDisabled();
        KTable<String, String> table;
        if (aggregator.equals("tomb")) {
            table = in.groupByKey(Grouped.with(Serdes.String(), Serdes.String())).aggregate(() -> "", (k, v, acc) -> {
                String p = v.split(",", -1)[1];
                return p.equals("z") ? null : acc + p;
            }, store);
        } else {
            table = in.groupByKey(Grouped.with(Serdes.String(), Serdes.String())).aggregate(() -> "0|0|", Replay::step,
                store);
        }
        table.toStream().to("out", Produced.with(Serdes.String(), Serdes.String()));
    }

    /**
     * A chain in one task: what an upstream operator forwards, filtered, then aggregated downstream.
     * up tjoin: stream "left" (values n,p) joined with table "right" (values: a region), value p|region, then
     * records whose region is null or x filtered out, then a windowed count|fold of p.
     * up sjoin: stream-stream join of "left" and "right" (before, after, join grace), value p|r with '-' for a
     * missing side, records whose value starts with x filtered out, then a windowed count|fold of the values.
     * up agg, sess, slide: a count of "left" in time, session or sliding windows (windowCounts), rows with a count
     * below 2 filtered out, re-keyed to the window's key, then a table count|fold of start:count. Every output key
     * is key \t start \t end.
     */
    static void chain(StreamsBuilder builder, String up, String how, long size, long advance, long grace,
                      long before, long after, long joinGrace) {
        KStream<String, String> left = builder.stream("left", Consumed.with(Serdes.String(), Serdes.String()));
        if (up.equals("agg") || up.equals("sess") || up.equals("slide")) {
            KTable<Windowed<String>, String> counts = windowCounts(left, up, how, size, advance, grace);
            counts.toStream()
                .filter((wk, c) -> Long.parseLong(c) >= 2)
                .map((wk, c) -> KeyValue.pair(wk.key(), wk.window().start() + ":" + c))
                .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                .aggregate(() -> "0|", (k, v, acc) -> fold(acc, v + ";"),
                    Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("down")
                        .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()).withCachingDisabled())
                .toStream()
                .map((k, v) -> KeyValue.pair(k + "\t-\t-", v))
                .to("out", Produced.with(Serdes.String(), Serdes.String()));
            return;
        }
        if (up.equals("rtjoin") || up.equals("ttjoin")) {
            tableJoins(builder, left, how, up.equals("rtjoin"));
            return;
        }
        if (up.equals("atjoin") || up.equals("atself")) {
            aggregateTableJoin(builder, left, how, up.equals("atself"));
            return;
        }
        if (up.equals("ajoin")) {
            aggregateStreamJoin(builder, left, how);
            return;
        }
        if (up.equals("tsj") || up.equals("asj")) {
            streamJoinInTask(builder, left, up.equals("asj"), how, before, after, joinGrace);
            return;
        }
        KStream<String, String> joined;
        if (up.equals("tjoin")) {
            KTable<String, String> table = plainTable(builder, "right", "table");
            ValueJoiner<String, String, String> joiner = (l, r) -> l.split(",", -1)[1] + "|" + r;
            Joined<String, String, String> with = Joined.with(Serdes.String(), Serdes.String(), Serdes.String());
            joined = how.equals("left") ? left.leftJoin(table, joiner, with) : left.join(table, joiner, with);
            joined = joined.filter((k, v) -> {
                String region = v.substring(v.indexOf('|') + 1);
                return !region.equals("null") && !region.equals("x");
            });
        } else {
            KStream<String, String> right = builder.stream("right", Consumed.with(Serdes.String(), Serdes.String()));
            JoinWindows windows = JoinWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(after),
                Duration.ofMillis(joinGrace)).before(Duration.ofMillis(before));
            ValueJoiner<String, String, String> joiner =
                (l, r) -> (l == null ? "-" : l.split(",", -1)[1]) + "|" + (r == null ? "-" : r);
            StreamJoined<String, String, String> with =
                StreamJoined.with(Serdes.String(), Serdes.String(), Serdes.String());
            joined = switch (how) {
                case "inner" -> left.join(right, joiner, windows, with);
                case "left" -> left.leftJoin(right, joiner, windows, with);
                case "outer" -> left.outerJoin(right, joiner, windows, with);
                default -> throw new IllegalArgumentException("unknown join: " + how);
            };
            if (up.equals("sjt")) {  // the rows as they are, joined with table "third" of the same keys
                joined.join(plainTable(builder, "third", "third"), (l, r) -> l + ">" + r,
                        Joined.with(Serdes.String(), Serdes.String(), Serdes.String()))
                    .map((k, v) -> KeyValue.pair((k == null ? "\\N" : k) + "\t-\t-", v))
                    .to("out", Produced.with(Serdes.String(), Serdes.String()));
                return;
            }
            joined = joined.filter((k, v) -> !v.startsWith("x"));
        }
        boolean table = up.equals("tjoin");
        TimeWindows windows = TimeWindows.ofSizeAndGrace(Duration.ofMillis(size), Duration.ofMillis(grace))
            .advanceBy(Duration.ofMillis(advance));
        joined.groupByKey(Grouped.with(Serdes.String(), Serdes.String())).windowedBy(windows)
            .aggregate(() -> "0|", (k, v, acc) -> fold(acc, table ? v.substring(0, v.indexOf('|')) : v + ";"),
                Materialized.<String, String, WindowStore<Bytes, byte[]>>as("down")
                    .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()).withCachingDisabled())
            .toStream()
            .map((wk, v) -> KeyValue.pair(wk.key() + "\t" + wk.window().start() + "\t" + wk.window().end(), v))
            .to("out", Produced.with(Serdes.String(), Serdes.String()));
    }

    /**
     * A chain "rtjoin" or "ttjoin": two stream-table joins. Stream "left" (values n,p) joined (how: inner|left) with
     * table "right" (values: regions), value p|region ("null" without one), then inner-joined with table "third",
     * value row&gt;third's value. rtjoin, the enrichment chain: rows whose value is longer than 6 characters (a
     * region of the scenario's own partition) re-keyed to their region first (selectKey, a repartition topic;
     * "third" is keyed by region). ttjoin: the rows as they are (same key, same task). Output key: key \t - \t -
     * (a null key as the harness writes it).
     */
    private static void tableJoins(StreamsBuilder builder, KStream<String, String> left, String how, boolean rekey) {
        KTable<String, String> regions = plainTable(builder, "right", "table");
        KTable<String, String> third = plainTable(builder, "third", "third");
        ValueJoiner<String, String, String> joiner = (l, r) -> l.split(",", -1)[1] + "|" + r;
        Joined<String, String, String> with = Joined.with(Serdes.String(), Serdes.String(), Serdes.String());
        KStream<String, String> joined = how.equals("left") ? left.leftJoin(regions, joiner, with)
            : left.join(regions, joiner, with);
        if (rekey) {
            joined = joined.filter((k, v) -> v.length() > 6).selectKey((k, v) -> v.substring(2));
        }
        joined.join(third, (l, r) -> l + ">" + r, with)
            .map((k, v) -> KeyValue.pair((k == null ? "\\N" : k) + "\t-\t-", v))
            .to("out", Produced.with(Serdes.String(), Serdes.String()));
    }

    /** A table of String keys and values read from `topic`, in a key-value store `store` with caching off. */
    private static KTable<String, String> plainTable(StreamsBuilder builder, String topic, String store) {
        return builder.table(topic, Consumed.with(Serdes.String(), Serdes.String()),
            Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as(store)
                .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()).withCachingDisabled());
    }

    /**
     * A chain "atjoin": a stream joined with a table that an aggregation computes in the same task. Stream "right"
     * grouped by key and aggregated (count|fold of the values, caching off) into a table; stream "left" (values n,p)
     * joined (how: inner|left) with it, value p|count|fold ("null" without one). Output key: key \t - \t -.
     * "atself": the aggregation reads "left" itself (one source node, two children: the aggregation, then the join).
     */
    private static void aggregateTableJoin(StreamsBuilder builder, KStream<String, String> left, String how,
                                           boolean self) {
        KStream<String, String> counted = self ? left
            : builder.stream("right", Consumed.with(Serdes.String(), Serdes.String()));
        KTable<String, String> counts = counted
            .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
            .aggregate(() -> "0|", (k, v, acc) -> fold(acc, v),
                Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("counts")
                    .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()).withCachingDisabled());
        ValueJoiner<String, String, String> joiner = (l, r) -> l.split(",", -1)[1] + "|" + r;
        Joined<String, String, String> with = Joined.with(Serdes.String(), Serdes.String(), Serdes.String());
        KStream<String, String> joined = how.equals("left") ? left.leftJoin(counts, joiner, with)
            : left.join(counts, joiner, with);
        // a left join forwards a null key (3.7+): written as the harness writes a null
        joined.map((k, v) -> KeyValue.pair((k == null ? "\\N" : k) + "\t-\t-", v))
            .to("out", Produced.with(Serdes.String(), Serdes.String()));
    }

    /**
     * A chain "ajoin": an aggregation's update stream joined, as it is, with a table. Stream "left" grouped by key
     * and aggregated (count|fold of the values, caching off); every update (KTable#toStream) joined (how:
     * inner|left) with table "right", value count|fold&gt;region ("null" without one). Output key: key \t - \t -.
     */
    private static void aggregateStreamJoin(StreamsBuilder builder, KStream<String, String> left, String how) {
        KTable<String, String> regions = plainTable(builder, "right", "table");
        KStream<String, String> updates = left.groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
            .aggregate(() -> "0|", (k, v, acc) -> fold(acc, v),
                Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("counts")
                    .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()).withCachingDisabled())
            .toStream();
        ValueJoiner<String, String, String> joiner = (c, r) -> c + ">" + r;
        Joined<String, String, String> with = Joined.with(Serdes.String(), Serdes.String(), Serdes.String());
        KStream<String, String> joined = how.equals("left") ? updates.leftJoin(regions, joiner, with)
            : updates.join(regions, joiner, with);
        joined.map((k, v) -> KeyValue.pair(k + "\t-\t-", v))
            .to("out", Produced.with(Serdes.String(), Serdes.String()));
    }

    /**
     * A chain "tsj" or "asj": a stream-stream join (how: inner|left|outer; before, after, grace) one of whose sides is
     * another operator's rows, as they are, in the same task. tsj: stream "left" (values n,p) inner-joined with table
     * "right" (regions), value p|region, joined with stream "third". asj: stream "left" grouped by key and aggregated
     * (count|fold of the values, caching off), every update (KTable#toStream) joined with stream "right". Value
     * row|other ("-" for a side without a record). Output key: key \t - \t - (a null key as the harness writes it).
     */
    private static void streamJoinInTask(StreamsBuilder builder, KStream<String, String> left, boolean aggregate,
                                         String how, long before, long after, long joinGrace) {
        KStream<String, String> rows;
        KStream<String, String> other;
        if (aggregate) {
            rows = left.groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                .aggregate(() -> "0|", (k, v, acc) -> fold(acc, v),
                    Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("counts")
                        .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()).withCachingDisabled())
                .toStream();
            other = builder.stream("right", Consumed.with(Serdes.String(), Serdes.String()));
        } else {
            rows = left.join(plainTable(builder, "right", "table"), (l, r) -> l.split(",", -1)[1] + "|" + r,
                Joined.with(Serdes.String(), Serdes.String(), Serdes.String()));
            other = builder.stream("third", Consumed.with(Serdes.String(), Serdes.String()));
        }
        JoinWindows windows = JoinWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(after),
            Duration.ofMillis(joinGrace)).before(Duration.ofMillis(before));
        ValueJoiner<String, String, String> joiner = (l, r) -> (l == null ? "-" : l) + "|" + (r == null ? "-" : r);
        StreamJoined<String, String, String> with = StreamJoined.with(Serdes.String(), Serdes.String(), Serdes.String());
        KStream<String, String> joined = switch (how) {
            case "inner" -> rows.join(other, joiner, windows, with);
            case "left" -> rows.leftJoin(other, joiner, windows, with);
            case "outer" -> rows.outerJoin(other, joiner, windows, with);
            default -> throw new IllegalArgumentException("unknown join: " + how);
        };
        joined.map((k, v) -> KeyValue.pair((k == null ? "\\N" : k) + "\t-\t-", v))
            .to("out", Produced.with(Serdes.String(), Serdes.String()));
    }

    /** The upstream of a chain "agg", "sess" or "slide": a count of "left" in time (size, advance), session (gap:
     * size) or sliding (time difference: size) windows, every update (how "-"), through
     * suppress(untilWindowCloses) ("suppress"), or emitted on window close ("close"). */
    private static KTable<Windowed<String>, String> windowCounts(KStream<String, String> left, String up, String how,
                                                                 long size, long advance, long grace) {
        KGroupedStream<String, String> grouped = left.groupByKey(Grouped.with(Serdes.String(), Serdes.String()));
        Initializer<String> zero = () -> "0";
        Aggregator<String, String, String> one = (k, v, acc) -> Long.toString(Long.parseLong(acc) + 1);
        KTable<Windowed<String>, String> counts;
        if (up.equals("sess")) {
            SessionWindowedKStream<String, String> windowed = grouped.windowedBy(
                SessionWindows.ofInactivityGapAndGrace(Duration.ofMillis(size), Duration.ofMillis(grace)));
            if (how.equals("close")) {
                windowed = windowed.emitStrategy(EmitStrategy.onWindowClose());
            }
            counts = windowed.aggregate(zero, one, (k, a, b) -> Long.toString(Long.parseLong(a) + Long.parseLong(b)),
                Materialized.<String, String, SessionStore<Bytes, byte[]>>as("up")
                    .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()).withCachingDisabled());
        } else {
            TimeWindowedKStream<String, String> windowed = up.equals("slide")
                ? grouped.windowedBy(SlidingWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(size),
                    Duration.ofMillis(grace)))
                : grouped.windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(size), Duration.ofMillis(grace))
                    .advanceBy(Duration.ofMillis(advance)));
            if (how.equals("close")) {
                windowed = windowed.emitStrategy(EmitStrategy.onWindowClose());
            }
            Materialized<String, String, WindowStore<Bytes, byte[]>> store = Materialized
                .<String, String, WindowStore<Bytes, byte[]>>as("up")
                .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()).withCachingDisabled();
            // time windows emitted on close: a day, as emit-on-close reads the closed windows through the store's
            // retention, which backfill models for them as keeping each until emitted (sliding: the default, modelled)
            if (how.equals("close") && up.equals("agg")) {
                store = store.withRetention(Duration.ofDays(1));
            }
            counts = windowed.aggregate(zero, one, store);
        }
        return how.equals("suppress")
            ? counts.suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded())) : counts;
    }

    /** count | fold: one more, and the text appended. */
    private static String fold(String acc, String text) {
        int bar = acc.indexOf('|');
        return (Long.parseLong(acc.substring(0, bar)) + 1) + "|" + acc.substring(bar + 1) + text;
    }

    /** The value's third field (n,p,t) as the timestamp; a negative, missing or unreadable one is returned as -1,
     * which Kafka Streams skips (LogAndSkipOnInvalidTimestamp does the same). */
    public static final class ValueTime implements TimestampExtractor {
        @Override
        public long extract(ConsumerRecord<Object, Object> record, long partitionTime) {
            return of(record);
        }

        static long of(ConsumerRecord<Object, Object> record) {
            Object value = record.value();
            String text = value instanceof byte[] b ? new String(b, StandardCharsets.UTF_8)
                : value instanceof String s ? s : null;
            String[] f = text == null ? new String[0] : text.split(",", -1);
            try {
                return f.length > 2 ? Math.max(-1, Long.parseLong(f[2])) : -1;
            } catch (NumberFormatException e) {
                return -1;
            }
        }
    }

    /** As {@link ValueTime}, with the partition time for an invalid one (UsePartitionTimeOnInvalidTimestamp). */
    public static final class ValueTimeOrPartitionTime implements TimestampExtractor {
        @Override
        public long extract(ConsumerRecord<Object, Object> record, long partitionTime) {
            return orPartitionTime(ValueTime.of(record), partitionTime);
        }
    }

    /** A valid timestamp as it is, an invalid one (negative) the partition time: UsePartitionTimeOnInvalidTimestamp,
     * which throws where there is no partition time yet. */
    static long orPartitionTime(long t, long partitionTime) {
        if (t >= 0) {
            return t;
        }
        if (partitionTime < 0) {
            throw new IllegalStateException("an invalid timestamp and no partition time yet");
        }
        return partitionTime;
    }

    /** Stores.persistentVersionedKeyValueStore(name, history) (Kafka Streams 3.5+). */
    private static KeyValueBytesStoreSupplier versionedStore(long history) {
        try {
            Method m = Stores.class.getMethod("persistentVersionedKeyValueStore", String.class, Duration.class);
            return (KeyValueBytesStoreSupplier) m.invoke(null, "table", Duration.ofMillis(history));
        } catch (ReflectiveOperationException e) {
            throw new UnsupportedOperationException("this Kafka Streams version has no versioned stores (3.5+)");
        }
    }

    /** Joined#withGracePeriod (Kafka Streams 3.6+). */
    @SuppressWarnings("unchecked")
    private static Joined<String, String, String> withGrace(Joined<String, String, String> joined, long grace) {
        try {
            Method m = Joined.class.getMethod("withGracePeriod", Duration.class);
            return (Joined<String, String, String>) m.invoke(joined, Duration.ofMillis(grace));
        } catch (ReflectiveOperationException e) {
            throw new UnsupportedOperationException("this Kafka Streams version has no join grace period (3.6+)");
        }
    }
}
