package io.backfill.harness;

import java.lang.reflect.Method;
import java.time.Duration;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.ValueJoiner;
import org.apache.kafka.streams.state.KeyValueBytesStoreSupplier;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The topologies of Replay beyond one windowed operator: stream-table joins (plain and versioned tables),
 * table aggregations, and KStream#filter before an operator. Built with the DSL only, as an application would.
 * APIs newer than the oldest version judged are called by reflection, so the harness still loads there and
 * reports the missing API as the scenario's error.
 */
final class Topologies {
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
                          ValueJoiner<String, String, String> joiner) {
        KStream<String, String> stream = filtered(
            builder.stream("left", Consumed.with(Serdes.String(), Serdes.String())), filter);
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
