package io.backfill.spark;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.PriorityQueue;

import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.JoinedRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * The merge of a task's queues, as Kafka Streams' PartitionGroup takes them (backfill/order/tasks.py,
 * docs/semantics.md §2.2-§2.5), in two streamed passes that hold no task whole.
 *
 * <p>The real engine keeps the task's non-empty queues in a {@link PriorityQueue} keyed by the head record's
 * timestamp alone: each step polls the heap, takes that queue's head, and offers the queue again while it has
 * records. On equal timestamps the heap's layout decides, so the layout is replayed here with the same class.
 *
 * <p>{@link #heads} runs over rows sorted by (task, queue, offset). Per row: the queue's partition time with
 * and before it; whether the row takes part in the merge ({@code _in_heap}: processed, with a timestamp, not
 * past the run's cool-down); {@code _merge_key}, the largest timestamp of the queue's merging rows so far
 * (a row that does not merge has the key of the one before it, so it follows it; null before any); and
 * {@code _next_head}, the timestamp of the queue's next merging row, which is the queue's head once this row
 * is taken (null: the queue is then empty). The first merging row of each queue also leaves as a marker
 * copy ({@code _marker}) that sorts before every other row of its task and carries the queue's first head.
 *
 * <p>{@link #merge} runs over the same rows, sorted by (task, _merge_key, group, queue, offset). A greedy merge
 * by head timestamp takes rows in non-decreasing merge key, so only rows of equal key can change places, and
 * a queue's rows of one key are consecutive. The markers build each sub-topology's heap as the consumer first
 * hands the queues over (topic name, then queue); each run of rows with one key is then taken as the heap
 * gives it. When a single queue's head holds that key, its rows stream through; when several tie, the rows of
 * that key are buffered (rows whose timestamps tie across queues) and taken as the heap polls them. Each row
 * leaves with {@code seq} and the operators' stream times ({@link Running}) in that order; markers do not
 * leave. Both results say they are spread by task, so the sort between them shuffles nothing.
 */
public final class MergedQueues {
  private MergedQueues() {}

  public static Dataset<Row> heads(Dataset<Row> sorted, String task, String queue, String ts, String counted,
                                   List<? extends Number> until, int partitions) {
    org.apache.spark.sql.classic.Dataset<Row> df = (org.apache.spark.sql.classic.Dataset<Row>) sorted;
    StructType in = df.schema();
    requireType(in, ts, DataTypes.LongType);
    requireType(in, queue, DataTypes.IntegerType);
    StructType out = in.add("_partition_time", DataTypes.LongType).add("_partition_time_before", DataTypes.LongType)
        .add("_merge_key", DataTypes.LongType).add("_next_head", DataTypes.LongType)
        .add("_in_heap", DataTypes.BooleanType, false).add("_marker", DataTypes.BooleanType, false);
    long[] bounds = new long[until.size()];
    for (int i = 0; i < bounds.length; i++) {
      // Py4J hands a small Python int over as an Integer
      bounds[i] = until.get(i) == null ? Long.MAX_VALUE : until.get(i).longValue();
    }
    Heads pass = new Heads(in.fieldIndex(task), in.apply(task).dataType(), in.fieldIndex(queue), in.fieldIndex(ts),
        in.fieldIndex(counted), bounds, out);
    JavaRDD<InternalRow> rows = df.queryExecution().toRdd().toJavaRDD().mapPartitions(pass::over);
    return Plans.spreadByTask(df.sparkSession(), rows, out, in.fieldIndex(task), partitions);
  }

  public static Dataset<Row> merge(Dataset<Row> sorted, String task, String queue, String group, String topic,
                                   String ts, String counted, List<String> flags, List<String> names,
                                   int queues, int partitions) {
    return merge(sorted, task, queue, group, topic, ts, counted, flags, names, queues, partitions, false);
  }

  /**
   * {@code recorded}: the rows come in a recorded processing order ({@code order_by}: sorted by task, then that
   * order) and leave in it, with their running values; the heap is not consulted and the markers do not leave.
   */
  public static Dataset<Row> merge(Dataset<Row> sorted, String task, String queue, String group, String topic,
                                   String ts, String counted, List<String> flags, List<String> names,
                                   int queues, int partitions, boolean recorded) {
    if (flags.size() != names.size()) {
      throw new IllegalArgumentException("one name per flag column");
    }
    org.apache.spark.sql.classic.Dataset<Row> df = (org.apache.spark.sql.classic.Dataset<Row>) sorted;
    StructType in = df.schema();
    requireType(in, group, DataTypes.IntegerType);
    StructType out = in.add("seq", DataTypes.LongType, false);
    for (String name : names) {
      out = out.add(name, DataTypes.LongType);
    }
    int[] at = Plans.indexes(in, List.of(queue, group, topic, ts, counted, "_merge_key", "_next_head", "_in_heap",
        "_marker"));
    Merge pass = new Merge(in.fieldIndex(task), in.apply(task).dataType(), at, Plans.indexes(in, flags), queues, out,
        recorded);
    JavaRDD<InternalRow> rows = df.queryExecution().toRdd().toJavaRDD().mapPartitions(pass::over);
    return Plans.spreadByTask(df.sparkSession(), rows, out, in.fieldIndex(task), partitions);
  }

  private static void requireType(StructType schema, String column, DataType type) {
    if (!schema.apply(column).dataType().equals(type)) {
      throw new IllegalArgumentException(column + " must be " + type.simpleString() + ", not "
          + schema.apply(column).dataType().simpleString());
    }
  }

  /** The pass per queue (serializable: Spark ships it to the executors). */
  private static final class Heads implements java.io.Serializable {
    private final int task;
    private final DataType taskType;
    private final int queue;
    private final int ts;
    private final int counted;
    private final long[] until;
    private final StructType out;

    Heads(int task, DataType taskType, int queue, int ts, int counted, long[] until, StructType out) {
      this.task = task;
      this.taskType = taskType;
      this.queue = queue;
      this.ts = ts;
      this.counted = counted;
      this.until = until;
      this.out = out;
    }

    Iterator<InternalRow> over(Iterator<InternalRow> records) {
      return new Iterator<InternalRow>() {
        private final UnsafeProjection project = UnsafeProjection.create(out);
        private final TaskChange change = new TaskChange(task, taskType);
        private final JoinedRow joined = new JoinedRow();
        private final ArrayDeque<InternalRow> ready = new ArrayDeque<>();
        private boolean queueStarted;
        private boolean queueNull;
        private int queueValue;
        private Long partitionTime;
        private Long mergeKey;
        private InternalRow pending;  // the queue's last merging row, waiting for its next head
        private GenericInternalRow pendingAdded;

        @Override
        public boolean hasNext() {
          while (ready.isEmpty() && records.hasNext()) {
            take(records.next());
          }
          if (ready.isEmpty()) {
            flush(null);
          }
          return !ready.isEmpty();
        }

        @Override
        public InternalRow next() {
          if (!hasNext()) {
            throw new NoSuchElementException();
          }
          return ready.poll();
        }

        private void take(InternalRow r) {
          boolean newTask = change.starts(r);
          boolean nowNull = r.isNullAt(queue);
          int q = nowNull ? -1 : r.getInt(queue);
          if (newTask || !queueStarted || nowNull != queueNull || q != queueValue) {
            flush(null);
            partitionTime = null;
            mergeKey = null;
          }
          queueStarted = true;
          queueNull = nowNull;
          queueValue = q;
          Long before = partitionTime;
          boolean hasTs = !r.isNullAt(ts);
          if (hasTs && (partitionTime == null || r.getLong(ts) > partitionTime)) {
            partitionTime = r.getLong(ts);
          }
          // past the cool-down: the queue ended before it (the partition's first record at/after the bound
          // is the last one processed)
          boolean beyond = q >= 0 && q < until.length && before != null && before >= until[q];
          boolean merging = hasTs && !beyond && !nowNull && !r.isNullAt(counted) && r.getBoolean(counted);
          boolean first = merging && mergeKey == null;
          if (merging && (mergeKey == null || r.getLong(ts) > mergeKey)) {
            mergeKey = r.getLong(ts);
          }
          GenericInternalRow values = new GenericInternalRow(6);
          setLong(values, 0, partitionTime);
          setLong(values, 1, before);
          setLong(values, 2, mergeKey);
          values.setNullAt(3);
          values.setBoolean(4, merging);
          values.setBoolean(5, false);
          if (!merging) {
            ready.add(emit(r, values));
            return;
          }
          if (first) {  // the marker: the queue's first head, before everything of its task
            GenericInternalRow marker = new GenericInternalRow(6);
            setLong(marker, 0, partitionTime);
            setLong(marker, 1, before);
            marker.setLong(2, Long.MIN_VALUE);
            marker.setLong(3, r.getLong(ts));
            marker.setBoolean(4, false);
            marker.setBoolean(5, true);
            ready.add(emit(r, marker));
          }
          flush(r.getLong(ts));
          pending = r.copy();
          pendingAdded = values;
        }

        /** The pending row leaves with its next head (null: none). */
        private void flush(Long nextHead) {
          if (pending != null) {
            setLong(pendingAdded, 3, nextHead);
            ready.add(emit(pending, pendingAdded));
            pending = null;
          }
        }

        private InternalRow emit(InternalRow r, GenericInternalRow values) {
          return project.apply(joined.apply(r, values)).copy();
        }
      };
    }
  }

  private static void setLong(GenericInternalRow row, int i, Long value) {
    if (value == null) {
      row.setNullAt(i);
    } else {
      row.setLong(i, value);
    }
  }

  /** The pass per task (serializable: Spark ships it to the executors). */
  private static final class Merge implements java.io.Serializable {
    private static final int QUEUE = 0;
    private static final int GROUP = 1;
    private static final int TOPIC = 2;
    private static final int TS = 3;
    private static final int COUNTED = 4;
    private static final int KEY = 5;
    private static final int NEXT = 6;
    private static final int IN_HEAP = 7;
    private static final int MARKER = 8;

    private final int task;
    private final DataType taskType;
    private final int[] at;
    private final int[] flags;
    private final int queues;
    private final StructType out;
    private final boolean recorded;

    Merge(int task, DataType taskType, int[] at, int[] flags, int queues, StructType out, boolean recorded) {
      this.task = task;
      this.taskType = taskType;
      this.at = at;
      this.flags = flags;
      this.queues = queues;
      this.out = out;
      this.recorded = recorded;
    }

    Iterator<InternalRow> over(Iterator<InternalRow> records) {
      return new Iterator<InternalRow>() {
        private final UnsafeProjection project = UnsafeProjection.create(out);
        private final TaskChange change = new TaskChange(task, taskType);
        private final Running running = new Running(at[TS], at[COUNTED], flags);
        private final GenericInternalRow added = new GenericInternalRow(running.width());
        private final JoinedRow joined = new JoinedRow();
        private final ArrayDeque<InternalRow> ready = new ArrayDeque<>();
        private final long[] head = new long[queues];
        private final Map<Integer, PriorityQueue<Integer>> heaps = new HashMap<>();
        private final List<Object[]> markers = new ArrayList<>();  // {queue, group, topic, head}
        private boolean built;
        // the run of rows of one merge key and one group being taken
        private boolean inRun;
        private long runKey;
        private int runGroup;
        private boolean buffering;
        private final Map<Integer, ArrayDeque<InternalRow>> buffered = new HashMap<>();
        private int bufferedMerging;

        @Override
        public boolean hasNext() {
          while (ready.isEmpty() && records.hasNext()) {
            take(records.next());
          }
          if (ready.isEmpty()) {
            endRun();
          }
          return !ready.isEmpty();
        }

        @Override
        public InternalRow next() {
          if (!hasNext()) {
            throw new NoSuchElementException();
          }
          return ready.poll();
        }

        private void take(InternalRow r) {
          if (change.starts(r)) {
            endRun();
            running.reset();
            heaps.clear();
            markers.clear();
            built = false;
          }
          if (recorded) {
            if (!r.getBoolean(at[MARKER])) {
              emit(r);
            }
            return;
          }
          if (r.getBoolean(at[MARKER])) {
            String name = r.isNullAt(at[TOPIC]) ? "" : r.getUTF8String(at[TOPIC]).toString();
            markers.add(new Object[] {r.getInt(at[QUEUE]), r.getInt(at[GROUP]), name, r.getLong(at[NEXT])});
            return;
          }
          if (r.isNullAt(at[KEY])) {  // before any merging row of its queue: nothing to choose
            emit(r);
            return;
          }
          if (!built) {
            build();
          }
          long key = r.getLong(at[KEY]);
          int group = r.getInt(at[GROUP]);
          if (!inRun || key != runKey || group != runGroup) {
            endRun();
            startRun(key, group);
          }
          if (!buffering) {
            step(r);
            return;
          }
          int q = r.getInt(at[QUEUE]);
          buffered.computeIfAbsent(q, k -> new ArrayDeque<>()).add(r.copy());
          if (r.getBoolean(at[IN_HEAP])) {
            bufferedMerging++;
          }
        }

        /** Each sub-topology's heap, its queues offered in topic-name order (then queue order). */
        private void build() {
          markers.sort(Comparator.comparing((Object[] m) -> (String) m[2]).thenComparing(m -> (Integer) m[0]));
          for (Object[] m : markers) {
            int q = (Integer) m[0];
            head[q] = (Long) m[3];
            heaps.computeIfAbsent((Integer) m[1], g -> new PriorityQueue<>(Comparator.comparingLong(x -> head[x])))
                .offer(q);
          }
          built = true;
        }

        private void startRun(long key, int group) {
          inRun = true;
          runKey = key;
          runGroup = group;
          int tied = 0;
          for (int q : heaps.getOrDefault(group, new PriorityQueue<>())) {
            if (head[q] == key) {
              tied++;
            }
          }
          buffering = tied > 1;
        }

        /** A row of a run that one queue holds: a merging row is the heap's next; others follow theirs. */
        private void step(InternalRow r) {
          if (r.getBoolean(at[IN_HEAP])) {
            int q = poll();
            if (q != r.getInt(at[QUEUE])) {
              throw new IllegalStateException("merge order: queue " + r.getInt(at[QUEUE]) + " holds merge key "
                  + runKey + " but the heap gives queue " + q);
            }
            advance(q, r);
          }
          emit(r);
        }

        /** A run where several queues tie: taken as the heap polls them. */
        private void endRun() {
          if (inRun && buffering) {
            while (bufferedMerging > 0) {
              int q = poll();
              ArrayDeque<InternalRow> rows = buffered.get(q);
              if (rows == null || rows.isEmpty() || !rows.peek().getBoolean(at[IN_HEAP])) {
                throw new IllegalStateException("merge order: the heap gives queue " + q
                    + " but it holds no row of merge key " + runKey);
              }
              InternalRow r = rows.poll();
              bufferedMerging--;
              advance(q, r);
              emit(r);
              while (!rows.isEmpty() && !rows.peek().getBoolean(at[IN_HEAP])) {
                emit(rows.poll());
              }
            }
            for (ArrayDeque<InternalRow> rows : buffered.values()) {
              while (!rows.isEmpty()) {
                emit(rows.poll());
              }
            }
            buffered.clear();
          }
          inRun = false;
          buffering = false;
        }

        private int poll() {
          PriorityQueue<Integer> heap = heaps.get(runGroup);
          if (heap == null || heap.isEmpty()) {
            throw new IllegalStateException("merge order: no queue left for merge key " + runKey);
          }
          return heap.poll();
        }

        /** The queue's head is now its next merging row; it is offered again unless it is empty. */
        private void advance(int q, InternalRow r) {
          if (!r.isNullAt(at[NEXT])) {
            head[q] = r.getLong(at[NEXT]);
            heaps.get(runGroup).offer(q);
          }
        }

        private void emit(InternalRow r) {
          running.add(r, added, 0);
          ready.add(project.apply(joined.apply(r, added)).copy());
        }
      };
    }
  }
}
