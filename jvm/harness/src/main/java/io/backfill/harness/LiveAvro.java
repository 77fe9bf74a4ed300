package io.backfill.harness;

import java.nio.file.Path;
import java.time.Duration;
import java.util.Properties;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindowedDeserializer;
import org.apache.kafka.streams.kstream.TimeWindowedSerializer;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;

/**
 * A live Kafka Streams application whose topics are Avro in the schema registry's wire format ({@link AvroWire}):
 * the input's key an Avro {@code "string"}, its value an Avro record with a nullable double {@code amount}; per
 * key a tumbling window's {@code n} (the count) and {@code amount} (the sum of the non-null amounts, null when
 * there were none), emitted on every update ({@code updates}, cache off) or once when the window closes
 * ({@code final}: {@code suppress(untilWindowCloses)}).
 *
 * <p>Output: the key as {@link TimeWindowedSerializer} writes it over the Avro key serializer (the inner key's
 * wire bytes, then the window start as 8 bytes), the value an Avro record {@code {n: long, amount: [null,
 * double]}} in the wire format, with the output value schema's id.
 *
 * <p>Arguments: bootstrap application-id input-topic output-topic state-dir schema-folder key-schema-id
 * value-schema-id size-ms grace-ms updates|final. The folder holds {@code <id>.avsc} for every id the input
 * was written with and the two output ids. Prints {@code RUNNING} once running and {@code AT partition offset}
 * for each record it processes; SIGTERM closes it cleanly and prints {@code CLOSED}.
 */
public final class LiveAvro {
    private LiveAvro() {
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 11) {
            System.err.println("usage: LiveAvro bootstrap application-id input output state-dir schema-folder "
                + "key-id value-id size-ms grace-ms updates|final");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        AvroWire wire = new AvroWire(Path.of(args[5]));
        Live.runUntilClosed(new KafkaStreams(topology(args[2], args[3], wire, Integer.parseInt(args[6]),
            Integer.parseInt(args[7]), Long.parseLong(args[8]), Long.parseLong(args[9]), args[10]), props));
    }

    static org.apache.kafka.streams.Topology topology(String input, String output, AvroWire wire, int keyId,
                                                      int valueId, long sizeMs, long graceMs, String emit) {
        if (!emit.equals("updates") && !emit.equals("final")) {
            throw new IllegalArgumentException("emit is updates or final, not " + emit);
        }
        StreamsBuilder builder = new StreamsBuilder();
        Serde<String> keys = wire.strings(keyId);
        Serde<GenericRecord> values = Serdes.serdeFrom(wire.serializer(valueId), wire.deserializer());
        Serde<Windowed<String>> windowedKeys = Serdes.serdeFrom(new TimeWindowedSerializer<>(keys.serializer()),
            new TimeWindowedDeserializer<>(keys.deserializer(), sizeMs));
        Schema out = wire.schema(valueId);
        KTable<Windowed<String>, String> windows = builder.stream(input, Consumed.with(keys, values))
            .processValues(LiveCached.Where::new)
            .groupByKey()
            .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(sizeMs), Duration.ofMillis(graceMs)))
            // the aggregate as "n TAB sum-or-empty" in the store (a string serde: the store is not the point)
            .aggregate(() -> "0\t", (key, value, acc) -> add(acc, value), Materialized.with(keys, Serdes.String()));
        if (emit.equals("final")) {
            windows = windows.suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()));
        }
        windows.toStream()
            .mapValues(acc -> record(out, acc))
            .to(output, Produced.with(windowedKeys, values));
        return builder.build();
    }

    /** The aggregate after one more value: the count plus one, the amount added when the value has one. */
    static String add(String acc, GenericRecord value) {
        String[] a = acc.split("\t", -1);
        Object x = value == null ? null : value.get("amount");
        String amount = a[1];
        if (x != null) {
            double v = ((Number) x).doubleValue();
            amount = Double.toString(amount.isEmpty() ? v : Double.parseDouble(amount) + v);
        }
        return (Long.parseLong(a[0]) + 1) + "\t" + amount;
    }

    static GenericRecord record(Schema schema, String acc) {
        String[] a = acc.split("\t", -1);
        GenericRecord r = new GenericData.Record(schema);
        r.put("n", Long.parseLong(a[0]));
        r.put("amount", a[1].isEmpty() ? null : Double.parseDouble(a[1]));
        return r;
    }
}
