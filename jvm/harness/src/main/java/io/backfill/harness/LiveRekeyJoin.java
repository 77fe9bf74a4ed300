package io.backfill.harness;

import java.time.Duration;

import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.StreamJoined;

/**
 * A live Kafka Streams application that re-keys before a stream-stream join: clicks ({@code selectKey} the
 * click's page, {@code /login} mapped to a null key, which the repartition drops before an inner join) joined
 * with a topic of page records keyed by page, within two minutes either way, grace one day (no store expires:
 * every pair is emitted whatever order the repartition topic received its writers' records in).
 *
 * <p>The repartition topic takes the page topic's partition count (co-partitioning). Output: key the page,
 * value {@code user+title}, timestamp the later of the two records.
 *
 * <p>Arguments: bootstrap application-id clicks-topic pages-topic output-topic state-dir. Prints
 * {@code RUNNING} once the application runs; SIGTERM closes it cleanly and prints {@code CLOSED}.
 */
public final class LiveRekeyJoin {
    private LiveRekeyJoin() {
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 6) {
            System.err.println("usage: LiveRekeyJoin bootstrap application-id clicks pages output state-dir");
            System.exit(2);
        }
        Live.runUntilClosed(new KafkaStreams(topology(args[2], args[3], args[4]), LiveRekey.props(args[0], args[1],
                                                                                                    args[5])));
    }

    static org.apache.kafka.streams.Topology topology(String clicksTopic, String pagesTopic, String output) {
        StreamsBuilder builder = new StreamsBuilder();
        Serde<String> text = Serdes.String();
        KStream<String, String> clicks = builder.stream(clicksTopic, Consumed.with(text, text))
            .selectKey((key, click) -> LiveRekey.page(click));
        KStream<String, String> pages = builder.stream(pagesTopic, Consumed.with(text, text));
        clicks.join(pages, (click, page) -> FlatJson.text(click, "user") + "+" + FlatJson.text(page, "title"),
                JoinWindows.ofTimeDifferenceAndGrace(Duration.ofMinutes(2), Duration.ofDays(1)),
                StreamJoined.with(text, text, text).withName("clicks-pages"))
            .to(output, Produced.with(text, text));
        return builder.build();
    }
}
