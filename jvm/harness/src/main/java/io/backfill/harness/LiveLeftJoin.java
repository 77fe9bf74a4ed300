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
 * A live Kafka Streams application with a left join of two co-partitioned topics (clicks and impressions,
 * both keyed by user): a click with every impression from 10 minutes before it to 1 minute after it, grace
 * 2 minutes; a click without one comes out once with {@code null} for the impression, when its window has
 * closed (the spurious-result fix, its outer store scanned at most once per second of wall clock).
 *
 * <p>Output: key the user, value {@code <click ad>+<impression ad or null>}, timestamp the later record's.
 *
 * <p>Arguments: bootstrap application-id clicks-topic impressions-topic output-topic state-dir. Prints
 * {@code RUNNING} once the application runs; SIGTERM closes it cleanly and prints {@code CLOSED}.
 */
public final class LiveLeftJoin {
    private LiveLeftJoin() {
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 6) {
            System.err.println("usage: LiveLeftJoin bootstrap application-id clicks impressions output state-dir");
            System.exit(2);
        }
        Live.runUntilClosed(new KafkaStreams(topology(args[2], args[3], args[4]), LiveRekey.props(args[0], args[1],
                                                                                                    args[5])));
    }

    static org.apache.kafka.streams.Topology topology(String clicksTopic, String impressionsTopic, String output) {
        StreamsBuilder builder = new StreamsBuilder();
        Serde<String> text = Serdes.String();
        KStream<String, String> clicks = builder.stream(clicksTopic, Consumed.with(text, text));
        KStream<String, String> impressions = builder.stream(impressionsTopic, Consumed.with(text, text));
        clicks.leftJoin(impressions,
                (click, impression) -> FlatJson.text(click, "ad") + "+"
                    + (impression == null ? "null" : FlatJson.text(impression, "ad")),
                JoinWindows.ofTimeDifferenceAndGrace(Duration.ofMinutes(10), Duration.ofMinutes(2))
                    .after(Duration.ofMinutes(1)),
                StreamJoined.with(text, text, text).withName("clicks-impressions"))
            .to(output, Produced.with(text, text));
        return builder.build();
    }
}
