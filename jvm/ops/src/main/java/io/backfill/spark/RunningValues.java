package io.backfill.spark;

import java.util.Iterator;
import java.util.List;

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
 * A task's running values in one streamed pass, for backfill's order (backfill/order/tasks.py).
 *
 * <p>Spark's window functions buffer a window partition whole before computing a running value over it; a
 * task is one Kafka partition, so a window over a task holds a whole partition's records in memory. Here the
 * records arrive sorted by (task, offset) within each Spark partition, and each record leaves with its values
 * as soon as it is read: memory stays constant whatever the size of a task (the sort before it spills).
 *
 * <p>Per record, over the records of its task up to it in that order:
 * <ul>
 *   <li>{@code _partition_time}: the largest timestamp, this record's included; {@code _partition_time_before}:
 *   the same without it (null when there is none: nulls are skipped, as SQL's max does);</li>
 *   <li>{@code seq}: how many records the {@code counted} column marks true, this one included;</li>
 *   <li>one running max per name: the largest timestamp of the records its flag column marks true.</li>
 * </ul>
 *
 * <p>The input is hash-partitioned by the task column alone over {@code partitions} Spark partitions
 * ({@code repartition(partitions, task)}): the result says so, so Spark does not shuffle it again for a
 * grouping that includes the task.
 */
public final class RunningValues {
  private RunningValues() {}

  public static Dataset<Row> apply(Dataset<Row> sorted, String task, String ts, String counted, List<String> flags,
                                   List<String> names, int partitions) {
    if (flags.size() != names.size()) {
      throw new IllegalArgumentException("one name per flag column");
    }
    org.apache.spark.sql.classic.Dataset<Row> df = (org.apache.spark.sql.classic.Dataset<Row>) sorted;
    StructType in = df.schema();
    if (!in.apply(ts).dataType().equals(DataTypes.LongType)) {
      throw new IllegalArgumentException(ts + " must be a bigint, not " + in.apply(ts).dataType().simpleString());
    }
    StructType out = in.add("_partition_time", DataTypes.LongType).add("_partition_time_before", DataTypes.LongType)
        .add("seq", DataTypes.LongType, false);
    for (String name : names) {
      out = out.add(name, DataTypes.LongType);
    }
    Pass pass = new Pass(in.fieldIndex(task), in.apply(task).dataType(), in.fieldIndex(ts), in.fieldIndex(counted),
        Plans.indexes(in, flags), out);
    JavaRDD<InternalRow> rows = df.queryExecution().toRdd().toJavaRDD().mapPartitions(pass::over);
    return Plans.spreadByTask(df.sparkSession(), rows, out, in.fieldIndex(task), partitions);
  }

  /** The pass over one Spark partition (serializable: Spark ships it to the executors). */
  private static final class Pass implements java.io.Serializable {
    private final int task;
    private final DataType taskType;
    private final int ts;
    private final int counted;
    private final int[] flags;
    private final StructType out;

    Pass(int task, DataType taskType, int ts, int counted, int[] flags, StructType out) {
      this.task = task;
      this.taskType = taskType;
      this.ts = ts;
      this.counted = counted;
      this.flags = flags;
      this.out = out;
    }

    Iterator<InternalRow> over(Iterator<InternalRow> records) {
      return new Iterator<InternalRow>() {
        private final UnsafeProjection project = UnsafeProjection.create(out);
        private final TaskChange change = new TaskChange(task, taskType);
        private final Running running = new Running(ts, counted, flags);
        private final GenericInternalRow added = new GenericInternalRow(2 + running.width());
        private final JoinedRow joined = new JoinedRow();
        private long max;
        private boolean maxSet;

        @Override
        public boolean hasNext() {
          return records.hasNext();
        }

        @Override
        public InternalRow next() {
          InternalRow r = records.next();
          if (change.starts(r)) {
            maxSet = false;
            running.reset();
          }
          if (maxSet) {
            added.setLong(1, max);
          } else {
            added.setNullAt(1);
          }
          if (!r.isNullAt(ts) && (!maxSet || r.getLong(ts) > max)) {
            max = r.getLong(ts);
            maxSet = true;
          }
          if (maxSet) {
            added.setLong(0, max);
          } else {
            added.setNullAt(0);
          }
          running.add(r, added, 2);
          return project.apply(joined.apply(r, added));
        }
      };
    }
  }
}
