package io.backfill.flink;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.math.BigDecimal;
import java.math.RoundingMode;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.apache.flink.api.common.eventtime.Watermark;
import org.apache.flink.api.common.eventtime.WatermarkGenerator;
import org.apache.flink.api.common.eventtime.WatermarkOutput;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.state.MapState;
import org.apache.flink.api.common.state.MapStateDescriptor;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.ProcessFunction;
import org.apache.flink.util.CloseableIterator;
import org.apache.flink.util.Collector;

/**
 * backfill's judge for the lookback rule engine in arrival order: a Flink job at parallelism 1 on a MiniCluster.
 *
 * <p>The rule function is written from the toolkit's own semantics notes (the DynamicKeyFunction /
 * DynamicAlertFunction pair of the fraud-detection pattern), not taken from any published code. What Flink's
 * runtime decides here: when the watermark reaches the keyed operator relative to the elements, when event-time
 * timers fire, keyed map state, and the order of everything on one channel.
 *
 * <p>Input (stdin, tab-separated, in arrival order; scenarios one after the other, each with event times shifted
 * above the previous one so that one watermark serves all):
 * <pre>
 * S  scenario  out_of_orderness_ms  compat(intended|demo)
 * R  scenario  ruleId  state(ACTIVE|PAUSE|DELETE)  keys(comma-separated)  field  aggregator  operator  limit  window_ms
 * C  scenario  control(CLEAR_STATE_ALL|DELETE_RULES_ALL|...)
 * H  scenario  (the watermark stops here: none is emitted for the rest of the scenario, as when an idle input
 *    holds it back; the timers due after this point do not fire)
 * T  scenario  partition@offset  event_time  txid  name=text ... (the fields rules name, as text)
 * </pre>
 * Output (stdout): {@code A scenario ruleId key partition@offset value} per alert, in emission order, then
 * {@code END}.
 *
 * <p>Rule messages travel in-band, on the transactions' channel, so that their place among the transactions is
 * the arrival order given (with broadcast state it would be whatever the network interleaving is). The
 * watermark is the demo's: largest event time seen minus the out-of-orderness, held back until a rule message has
 * arrived (the rule stream's watermark before that is Long.MIN_VALUE), emitted after every element.
 */
public final class RulesHarness {
    private RulesHarness() {
    }

    public static void main(String[] args) throws Exception {
        List<String> lines = new ArrayList<>();
        try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                if (!line.isEmpty()) {
                    lines.add(line);
                }
            }
        }
        Configuration conf = new Configuration();
        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(1, conf);
        env.getConfig().setAutoWatermarkInterval(0);  // no periodic watermarks: only those after each element
        DataStream<String> input = env.fromCollection(lines)
                .assignTimestampsAndWatermarks(WatermarkStrategy.<String>forGenerator(ctx -> new ArrivalWatermarks())
                        .withTimestampAssigner((line, previous) -> line.startsWith("T\t")
                                ? Long.parseLong(line.split("\t", -1)[3]) : Long.MIN_VALUE));
        DataStream<String> alerts = input.process(new KeyFunction()).returns(Types.STRING)
                .keyBy(fork -> fork.split("\t", -1)[2], Types.STRING)
                .process(new AlertFunction()).returns(Types.STRING);
        StringBuilder out = new StringBuilder();
        try (CloseableIterator<String> it = alerts.executeAndCollect("backfill-rules-harness")) {
            while (it.hasNext()) {
                out.append(it.next()).append('\n');
            }
        }
        System.out.print(out);
        System.out.println("END");
    }

    /** Largest event time so far minus the scenario's out-of-orderness, once a rule message has arrived. */
    static final class ArrivalWatermarks implements WatermarkGenerator<String> {
        private long maxTs = Long.MIN_VALUE;
        private long outOfOrderness;
        private boolean rulesSeen;
        private boolean held;

        @Override
        public void onEvent(String line, long timestamp, WatermarkOutput output) {
            String[] f = line.split("\t", -1);
            switch (f[0]) {
                case "S":
                    outOfOrderness = Long.parseLong(f[2]);
                    rulesSeen = false;
                    held = false;
                    return;
                case "H":
                    held = true;
                    return;
                case "R":
                case "C":
                    rulesSeen = true;
                    break;
                case "T":
                    maxTs = Math.max(maxTs, timestamp);
                    break;
                default:
                    throw new IllegalArgumentException("unknown line " + line);
            }
            if (rulesSeen && maxTs != Long.MIN_VALUE && !held) {
                output.emitWatermark(new Watermark(maxTs - outOfOrderness));
            }
        }

        @Override
        public void onPeriodicEmit(WatermarkOutput output) {
        }
    }

    /** The forking function: one fork per rule it holds (ACTIVE or PAUSE), ascending rule id. */
    static final class KeyFunction extends ProcessFunction<String, String> {
        private final Map<String, TreeMap<Integer, String[]>> rules = new HashMap<>();
        private final Map<String, String> compat = new HashMap<>();

        @Override
        public void processElement(String line, Context ctx, Collector<String> out) {
            String[] f = line.split("\t", -1);
            String sc = f[1];
            String control = sc + "|#rules";
            switch (f[0]) {
                case "S":
                    compat.put(sc, f[3]);
                    rules.put(sc, new TreeMap<>());
                    return;
                case "H":
                    return;
                case "R": {
                    int id = Integer.parseInt(f[2]);
                    if (f[3].equals("DELETE")) {
                        rules.get(sc).remove(id);
                    } else {
                        rules.get(sc).put(id, f);
                    }
                    out.collect("U\t" + sc + "\t" + control + "\t" + line);
                    return;
                }
                case "C":
                    if (f[2].equals("DELETE_RULES_ALL")) {
                        rules.get(sc).clear();
                    }
                    out.collect("X\t" + sc + "\t" + control + "\t" + f[2]);
                    return;
                case "T": {
                    Map<String, String> fields = new HashMap<>();
                    for (int i = 5; i < f.length; i++) {
                        int eq = f[i].indexOf('=');
                        fields.put(f[i].substring(0, eq), f[i].substring(eq + 1));
                    }
                    boolean demo = compat.get(sc).equals("demo");
                    StringBuilder values = new StringBuilder();
                    for (int i = 5; i < f.length; i++) {
                        values.append('\t').append(f[i]);
                    }
                    for (String[] rule : rules.get(sc).values()) {
                        StringBuilder key = new StringBuilder("{");
                        String[] names = rule[4].isEmpty() ? new String[0] : rule[4].split(",");
                        for (int i = 0; i < names.length; i++) {
                            key.append(i == 0 ? "" : ";").append(names[i]).append('=')
                                    .append(fields.getOrDefault(names[i], "null"));
                        }
                        key.append('}');
                        String state = sc + "|" + (demo ? "" : rule[2] + "|") + key;
                        // F scenario statekey ruleId key t txid record fields...
                        out.collect("F\t" + sc + "\t" + state + "\t" + rule[2] + "\t" + key + "\t" + f[3] + "\t"
                                + (demo ? f[4] : f[2]) + "\t" + f[2] + values);
                    }
                    return;
                }
                default:
                    throw new IllegalArgumentException("unknown line " + line);
            }
        }
    }

    /** The alert function: keyed map state event time -> transactions, cleanup timers, the widest window. */
    static final class AlertFunction extends KeyedProcessFunction<String, String, String> {
        private final Map<String, Map<Integer, String[]>> rules = new HashMap<>();
        private final Map<String, Long> widest = new HashMap<>();
        private final Map<String, Long> clears = new HashMap<>();
        private transient MapState<Long, String> window;
        private transient ValueState<Long> cleared;

        @Override
        public void open(Configuration parameters) {
            window = getRuntimeContext().getMapState(new MapStateDescriptor<>("window", Types.LONG, Types.STRING));
            cleared = getRuntimeContext().getState(new ValueStateDescriptor<>("cleared", Types.LONG));
        }

        @Override
        public void processElement(String line, Context ctx, Collector<String> out) throws Exception {
            String[] f = line.split("\t", -1);
            String sc = f[1];
            Map<Integer, String[]> mine = rules.computeIfAbsent(sc, k -> new HashMap<>());
            switch (f[0]) {
                case "U": {
                    String[] r = java.util.Arrays.copyOfRange(f, 3, f.length);
                    int id = Integer.parseInt(r[2]);
                    if (r[3].equals("DELETE")) {
                        mine.remove(id);
                    } else {
                        mine.put(id, r);
                        long w = Long.parseLong(r[9]);
                        if (r[3].equals("ACTIVE") && (!widest.containsKey(sc) || w > widest.get(sc))) {
                            widest.put(sc, w);
                        }
                    }
                    return;
                }
                case "X":
                    if (f[3].equals("DELETE_RULES_ALL")) {
                        mine.clear();
                        widest.remove(sc);
                    } else if (f[3].equals("CLEAR_STATE_ALL")) {
                        clears.merge(sc, 1L, Long::sum);  // every key of the scenario is cleared (on next touch)
                    }
                    return;
                case "F":
                    fork(f, mine, ctx, out);
                    return;
                default:
                    throw new IllegalArgumentException("unknown line " + line);
            }
        }

        private void catchUpClears(String sc) throws Exception {
            long now = clears.getOrDefault(sc, 0L);
            Long mine = cleared.value();
            if (mine == null || mine != now) {
                window.clear();
                cleared.update(now);
            }
        }

        private void fork(String[] f, Map<Integer, String[]> rulesOf, Context ctx, Collector<String> out)
                throws Exception {
            String sc = f[1];
            catchUpClears(sc);
            long t = Long.parseLong(f[5]);
            String entry = f[6] + "\u0002" + String.join("\u0002", java.util.Arrays.copyOfRange(f, 8, f.length));
            String bucket = window.get(t);
            if (bucket == null) {
                window.put(t, entry);
            } else {
                boolean seen = false;
                for (String e : bucket.split("\u0001", -1)) {
                    seen |= e.split("\u0002", -1)[0].equals(f[6]);
                }
                if (!seen) {
                    window.put(t, bucket + "\u0001" + entry);
                }
            }
            String[] rule = rulesOf.get(Integer.parseInt(f[3]));
            if (rule == null || !rule[3].equals("ACTIVE")) {
                return;
            }
            long w = Long.parseLong(rule[9]);
            ctx.timerService().registerEventTimeTimer((t / 1000) * 1000);
            String field = rule[5];
            boolean counts = field.equals("COUNT_FLINK") || field.equals("COUNT_WITH_RESET_FLINK");
            List<BigDecimal> values = new ArrayList<>();
            List<Long> times = new ArrayList<>();
            for (Iterator<Long> it = window.keys().iterator(); it.hasNext(); ) {
                times.add(it.next());
            }
            java.util.Collections.sort(times);
            for (long ts : times) {
                if (ts < t - w || ts > t) {
                    continue;
                }
                for (String e : window.get(ts).split("\u0001", -1)) {
                    if (counts) {
                        values.add(BigDecimal.ONE);
                        continue;
                    }
                    for (String kv : e.split("\u0002", -1)) {
                        int eq = kv.indexOf('=');
                        if (eq > 0 && kv.substring(0, eq).equals(field)) {
                            try {
                                values.add(new BigDecimal(kv.substring(eq + 1)));
                            } catch (NumberFormatException ignored) {
                                // not a number: it contributes nothing (the toolkit sends none such here)
                            }
                        }
                    }
                }
            }
            BigDecimal value = aggregate(rule[6], values);
            if (holds(value, rule[7], new BigDecimal(rule[8]))) {
                if (field.equals("COUNT_WITH_RESET_FLINK")) {
                    window.clear();
                }
                out.collect("A\t" + sc + "\t" + f[3] + "\t" + f[4] + "\t" + f[7] + "\t" + plain(value));
            }
        }

        @Override
        public void onTimer(long timestamp, OnTimerContext ctx, Collector<String> out) throws Exception {
            String sc = ctx.getCurrentKey().substring(0, ctx.getCurrentKey().indexOf('|'));
            catchUpClears(sc);
            Long w = widest.get(sc);
            if (w == null) {
                return;
            }
            List<Long> old = new ArrayList<>();
            for (Iterator<Long> it = window.keys().iterator(); it.hasNext(); ) {
                long ts = it.next();
                if (ts < timestamp - w) {
                    old.add(ts);
                }
            }
            for (long ts : old) {
                window.remove(ts);
            }
        }

        private static BigDecimal aggregate(String aggregator, List<BigDecimal> values) {
            BigDecimal sum = BigDecimal.ZERO;
            for (BigDecimal v : values) {
                sum = sum.add(v);
            }
            switch (aggregator) {
                case "SUM":
                    return sum;
                case "AVG":
                    return sum.divide(BigDecimal.valueOf(values.size()), 10, RoundingMode.HALF_UP);
                case "MAX":
                    return values.stream().reduce(BigDecimal::max).orElseThrow();
                case "MIN":
                    return values.stream().reduce(BigDecimal::min).orElseThrow();
                default:
                    throw new IllegalArgumentException("aggregator " + aggregator);
            }
        }

        private static boolean holds(BigDecimal value, String op, BigDecimal limit) {
            int c = value.compareTo(limit);
            switch (op) {
                case "EQUAL":
                    return c == 0;
                case "NOT_EQUAL":
                    return c != 0;
                case "GREATER":
                    return c > 0;
                case "LESS":
                    return c < 0;
                case "GREATER_EQUAL":
                    return c >= 0;
                case "LESS_EQUAL":
                    return c <= 0;
                default:
                    throw new IllegalArgumentException("operator " + op);
            }
        }

        private static String plain(BigDecimal value) {
            return value.signum() == 0 ? "0" : value.stripTrailingZeros().toPlainString();
        }
    }
}
