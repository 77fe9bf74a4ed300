package io.backfill.harness;

import java.time.Duration;

import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.WindowedSerdes;

/**
 * A live Kafka Streams application of the PageViewRegion shape: page views (keyed by user) without a page are
 * filtered out, each view is joined with the user's profile from a table over the users topic ({@code leftJoin}:
 * the region the table held when the view was processed, or none), views without a region are filtered out,
 * the rest are re-keyed by region ({@code groupBy}, the repartition topic {@code <application-id>-by-region-
 * repartition}) and counted in hopping windows of 5 minutes every minute, with a grace of one day (nothing is
 * late, so each window's last count does not depend on how the repartition topic interleaves its writers).
 * Cache off: every update is emitted.
 *
 * <p>Output: the key as {@link WindowedSerdes#timeWindowedSerdeFrom} writes it (the region, then the window
 * start as 8 bytes), the value {@code {"views": n}}.
 *
 * <p>Arguments: bootstrap application-id pageviews-topic users-topic output-topic state-dir. Prints
 * {@code RUNNING} once the application runs; SIGTERM closes it cleanly and prints {@code CLOSED}.
 */
public final class LivePageViews {
    static final Duration SIZE = Duration.ofMinutes(5);

    private LivePageViews() {
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 6) {
            System.err.println("usage: LivePageViews bootstrap application-id pageviews users output state-dir");
            System.exit(2);
        }
        Live.runUntilClosed(new KafkaStreams(topology(args[2], args[3], args[4]),
                                             LiveRekey.props(args[0], args[1], args[5])));
    }

    static org.apache.kafka.streams.Topology topology(String pageviews, String users, String output) {
        StreamsBuilder builder = new StreamsBuilder();
        Serde<String> text = Serdes.String();
        KTable<String, String> profiles = builder.table(users, Consumed.with(text, text));
        builder.stream(pageviews, Consumed.with(text, text))
            .filter((user, view) -> view != null && FlatJson.text(view, "page") != null)
            .leftJoin(profiles, (view, profile) -> profile == null ? null : FlatJson.text(profile, "region"))
            .filter((user, region) -> region != null)
            .groupBy((user, region) -> region, Grouped.with("by-region", text, text))
            .windowedBy(TimeWindows.ofSizeAndGrace(SIZE, Duration.ofDays(1)).advanceBy(Duration.ofMinutes(1)))
            .count(Materialized.with(text, Serdes.Long()))
            .toStream()
            .mapValues(n -> "{\"views\": " + n + "}")
            .to(output, Produced.with(WindowedSerdes.timeWindowedSerdeFrom(String.class, SIZE.toMillis()), text));
        return builder.build();
    }
}
