package io.backfill.spark;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Objects;

import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.AttributeReference;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.ExpressionSet;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.JoinedRow;
import org.apache.spark.sql.catalyst.expressions.SortOrder;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.plans.logical.Statistics;
import org.apache.spark.sql.catalyst.plans.physical.HashPartitioning;
import org.apache.spark.sql.catalyst.types.DataTypeUtils;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connector.read.streaming.SparkDataStream;
import org.apache.spark.sql.execution.LogicalRDD;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

import scala.Option;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

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
        indexes(in, flags), out);
    JavaRDD<InternalRow> rows = df.queryExecution().toRdd().toJavaRDD().mapPartitions(pass::over);

    List<AttributeReference> attributes = CollectionConverters.asJava(DataTypeUtils.toAttributes(out));
    List<Expression> by = new ArrayList<>();
    by.add(attributes.get(in.fieldIndex(task)));
    List<Attribute> output = new ArrayList<>(attributes);
    Seq<Attribute> outputSeq = CollectionConverters.asScala(output).toSeq();
    Seq<SortOrder> noOrder = CollectionConverters.asScala(new ArrayList<SortOrder>()).toSeq();
    SparkSession session = df.sparkSession();
    LogicalRDD plan = new LogicalRDD(outputSeq, rows.rdd(),
        new HashPartitioning(CollectionConverters.asScala(by).toSeq(), partitions), noOrder, false,
        Option.<SparkDataStream>empty(), session, Option.<Statistics>empty(), Option.<ExpressionSet>empty());
    return org.apache.spark.sql.classic.Dataset.ofRows(session, plan);
  }

  private static int[] indexes(StructType schema, List<String> columns) {
    int[] at = new int[columns.size()];
    for (int i = 0; i < at.length; i++) {
      at[i] = schema.fieldIndex(columns.get(i));
    }
    return at;
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
        private final GenericInternalRow added = new GenericInternalRow(3 + flags.length);
        private final JoinedRow joined = new JoinedRow();
        private final boolean intTask = taskType.equals(DataTypes.IntegerType);
        private final long[] flagMax = new long[flags.length];
        private final boolean[] flagSet = new boolean[flags.length];
        private boolean started;
        private boolean taskNull;
        private int taskInt;
        private Object taskValue;
        private long max;
        private boolean maxSet;
        private long seq;

        @Override
        public boolean hasNext() {
          return records.hasNext();
        }

        @Override
        public InternalRow next() {
          InternalRow r = records.next();
          if (!sameTask(r)) {
            maxSet = false;
            seq = 0;
            java.util.Arrays.fill(flagSet, false);
          }
          if (maxSet) {
            added.setLong(1, max);
          } else {
            added.setNullAt(1);
          }
          boolean hasTs = !r.isNullAt(ts);
          long t = hasTs ? r.getLong(ts) : 0L;
          if (hasTs && (!maxSet || t > max)) {
            max = t;
            maxSet = true;
          }
          if (maxSet) {
            added.setLong(0, max);
          } else {
            added.setNullAt(0);
          }
          if (!r.isNullAt(counted) && r.getBoolean(counted)) {
            seq++;
          }
          added.setLong(2, seq);
          for (int i = 0; i < flags.length; i++) {
            if (hasTs && !r.isNullAt(flags[i]) && r.getBoolean(flags[i]) && (!flagSet[i] || t > flagMax[i])) {
              flagMax[i] = t;
              flagSet[i] = true;
            }
            if (flagSet[i]) {
              added.setLong(3 + i, flagMax[i]);
            } else {
              added.setNullAt(3 + i);
            }
          }
          return project.apply(joined.apply(r, added));
        }

        /** Whether r is of the task of the record before it (and remembers r's task). */
        private boolean sameTask(InternalRow r) {
          boolean isNull = r.isNullAt(task);
          boolean same;
          if (isNull) {
            same = started && taskNull;
          } else if (intTask) {
            int v = r.getInt(task);
            same = started && !taskNull && v == taskInt;
            taskInt = v;
          } else {
            Object v = r.get(task, taskType);
            same = started && !taskNull && Objects.equals(v, taskValue);
            taskValue = v instanceof org.apache.spark.unsafe.types.UTF8String ? ((org.apache.spark.unsafe.types.UTF8String) v).clone() : v;
          }
          started = true;
          taskNull = isNull;
          return same;
        }
      };
    }
  }
}
