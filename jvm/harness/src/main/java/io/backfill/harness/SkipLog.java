package io.backfill.harness;

import java.util.ArrayList;
import java.util.List;
import org.slf4j.ILoggerFactory;
import org.slf4j.IMarkerFactory;
import org.slf4j.Marker;
import org.slf4j.event.Level;
import org.slf4j.helpers.BasicMarkerFactory;
import org.slf4j.helpers.LegacyAbstractLogger;
import org.slf4j.helpers.MessageFormatter;
import org.slf4j.helpers.NOPMDCAdapter;
import org.slf4j.spi.MDCAdapter;
import org.slf4j.spi.SLF4JServiceProvider;

/**
 * The harness's SLF4J binding: Kafka Streams' skipped-record log, caught per thread.
 *
 * <p>Kafka Streams says which window it refused a record for only in its log ("Skipping record for expired
 * window. ... window=[a,b) expiration=[c] streamTime=[d]"), at WARN in 3.x and 4.x (DEBUG in older lines). A
 * replay thread that {@link #listen()}s gets each such line of the processors of {@code kstream.internals}
 * while it pipes one record; every other message, and every other thread's, is dropped, as slf4j-nop did.
 */
public final class SkipLog implements SLF4JServiceProvider {
    private static final String SOURCE = "org.apache.kafka.streams.kstream.internals";
    private static final String EXPIRED = "Skipping record for expired window";
    private static final ThreadLocal<List<String>> HEARD = new ThreadLocal<>();

    private final ILoggerFactory loggers = name -> new Caught(name, name.startsWith(SOURCE));
    private final IMarkerFactory markers = new BasicMarkerFactory();
    private final MDCAdapter mdc = new NOPMDCAdapter();

    /** From now on this thread hears the skipped-record lines; returns the list they are added to. */
    public static List<String> listen() {
        List<String> heard = new ArrayList<>();
        HEARD.set(heard);
        return heard;
    }

    /** This thread hears nothing any more. */
    public static void stop() {
        HEARD.remove();
    }

    @Override
    public ILoggerFactory getLoggerFactory() {
        return loggers;
    }

    @Override
    public IMarkerFactory getMarkerFactory() {
        return markers;
    }

    @Override
    public MDCAdapter getMDCAdapter() {
        return mdc;
    }

    @Override
    public String getRequestedApiVersion() {
        return "2.0.99";
    }

    @Override
    public void initialize() {
    }

    /** A logger that is on from DEBUG up for Kafka Streams' DSL processors, and off for everything else. */
    private static final class Caught extends LegacyAbstractLogger {
        private static final long serialVersionUID = 1L;
        private final boolean on;

        Caught(String name, boolean on) {
            this.name = name;
            this.on = on;
        }

        private boolean on() {
            return on && HEARD.get() != null;
        }

        @Override
        public boolean isTraceEnabled() {
            return false;
        }

        @Override
        public boolean isDebugEnabled() {
            return on();
        }

        @Override
        public boolean isInfoEnabled() {
            return on();
        }

        @Override
        public boolean isWarnEnabled() {
            return on();
        }

        @Override
        public boolean isErrorEnabled() {
            return on();
        }

        @Override
        protected String getFullyQualifiedCallerName() {
            return null;
        }

        @Override
        protected void handleNormalizedLoggingCall(Level level, Marker marker, String pattern, Object[] arguments,
                                                   Throwable thrown) {
            List<String> heard = HEARD.get();
            if (heard != null && pattern != null && pattern.startsWith(EXPIRED)) {
                heard.add(MessageFormatter.basicArrayFormat(pattern, arguments));
            }
        }
    }
}
