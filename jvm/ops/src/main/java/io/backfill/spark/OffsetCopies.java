package io.backfill.spark;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import java.util.Objects;
import java.util.Set;
import java.util.TreeSet;

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
import org.apache.spark.unsafe.types.UTF8String;

import scala.Option;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * One record per offset, checked in one streamed pass (backfill/order/offsets.py; docs/semantics.md §7.2).
 *
 * <p>The records arrive sorted by (queue, offset) within each Spark partition, so the copies of an offset
 * are adjacent. A run of rows of one queue and one offset is one record read several times:
 * <ul>
 *   <li>every copy has the same {@code copy} value (a hash of key, value, timestamp and headers as stored):
 *   the first leaves, with {@code _copies} = how many copies were left out; the others are not passed on;</li>
 *   <li>the copies differ: every copy leaves, with {@code _conflict} = what differs among the {@code compared}
 *   columns (the offset is unreadable);</li>
 * </ul>
 * and the first row of an offset has {@code _gap} = how many offsets of its queue are missing right before it
 * (null when none, and for the first offset of a queue). A row whose offset or copy value is null is checked
 * against nothing: it leaves as it is.
 *
 * <p>Memory: the copies of one offset (one row, in an input without copies). The output is spread as the input
 * is ({@code repartition(partitions, task)}) and keeps its order.
 */
public final class OffsetCopies {
  private OffsetCopies() {}

  public static Dataset<Row> apply(Dataset<Row> sorted, List<String> queue, String offset, String copy,
                                   List<String> compared, List<String> labels, String task, int partitions) {
    if (compared.size() != labels.size()) {
      throw new IllegalArgumentException("one label per compared column");
    }
    org.apache.spark.sql.classic.Dataset<Row> df = (org.apache.spark.sql.classic.Dataset<Row>) sorted;
    StructType in = df.schema();
    if (!in.apply(offset).dataType().equals(DataTypes.LongType)) {
      throw new IllegalArgumentException(offset + " must be a bigint");
    }
    StructType out = in.add("_copies", DataTypes.IntegerType).add("_conflict", DataTypes.StringType)
        .add("_gap", DataTypes.LongType);
    int[] queueAt = indexes(in, queue);
    DataType[] queueTypes = new DataType[queueAt.length];
    for (int i = 0; i < queueAt.length; i++) {
      queueTypes[i] = in.fields()[queueAt[i]].dataType();
    }
    int[] comparedAt = indexes(in, compared);
    DataType[] comparedTypes = new DataType[comparedAt.length];
    for (int i = 0; i < comparedAt.length; i++) {
      comparedTypes[i] = in.fields()[comparedAt[i]].dataType();
    }
    Pass pass = new Pass(queueAt, queueTypes, in.fieldIndex(offset), in.fieldIndex(copy),
        in.apply(copy).dataType(), comparedAt, comparedTypes, labels.toArray(new String[0]), out);
    JavaRDD<InternalRow> rows = df.queryExecution().toRdd().toJavaRDD().mapPartitions(pass::over);

    List<AttributeReference> attributes = CollectionConverters.asJava(DataTypeUtils.toAttributes(out));
    List<Expression> by = new ArrayList<>();
    by.add(attributes.get(in.fieldIndex(task)));
    Seq<Attribute> outputSeq = CollectionConverters.asScala(new ArrayList<Attribute>(attributes)).toSeq();
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

  /** Field values as Java values that compare by content (Spark's internal values may be reused buffers). */
  private static Object value(InternalRow r, int at, DataType type) {
    if (r.isNullAt(at)) {
      return null;
    }
    Object v = r.get(at, type);
    if (v instanceof UTF8String) {
      return ((UTF8String) v).clone();
    }
    if (v instanceof InternalRow) {
      return ((InternalRow) v).copy();
    }
    if (v instanceof org.apache.spark.sql.catalyst.util.ArrayData) {
      return ((org.apache.spark.sql.catalyst.util.ArrayData) v).copy();
    }
    return v;
  }

  private static boolean same(Object a, Object b) {
    if (a instanceof byte[] && b instanceof byte[]) {
      return Arrays.equals((byte[]) a, (byte[]) b);
    }
    return Objects.equals(a, b);
  }

  /** The pass over one Spark partition (serializable: Spark ships it to the executors). */
  private static final class Pass implements java.io.Serializable {
    private final int[] queue;
    private final DataType[] queueTypes;
    private final int offset;
    private final int copy;
    private final DataType copyType;
    private final int[] compared;
    private final DataType[] comparedTypes;
    private final String[] names;
    private final StructType out;

    Pass(int[] queue, DataType[] queueTypes, int offset, int copy, DataType copyType, int[] compared,
         DataType[] comparedTypes, String[] names, StructType out) {
      this.queue = queue;
      this.queueTypes = queueTypes;
      this.offset = offset;
      this.copy = copy;
      this.copyType = copyType;
      this.compared = compared;
      this.comparedTypes = comparedTypes;
      this.names = names;
      this.out = out;
    }

    Iterator<InternalRow> over(Iterator<InternalRow> records) {
      return new Iterator<InternalRow>() {
        private final UnsafeProjection project = UnsafeProjection.create(out);
        private final GenericInternalRow added = new GenericInternalRow(3);
        private final JoinedRow joined = new JoinedRow();
        private final ArrayDeque<InternalRow> ready = new ArrayDeque<>();
        private final List<InternalRow> group = new ArrayList<>();
        private InternalRow ahead;  // the first row of the next group, read already
        private InternalRow last;  // the first row of the last group with an offset

        @Override
        public boolean hasNext() {
          return !ready.isEmpty() || ahead != null || records.hasNext();
        }

        @Override
        public InternalRow next() {
          if (!ready.isEmpty()) {
            return ready.poll();
          }
          InternalRow single = fill();
          return single != null ? single : ready.poll();
        }

        /** Reads the next group of copies of one offset: returns a lone record (the usual case) as it leaves,
         * else queues what the group passes on and returns null. */
        private InternalRow fill() {
          group.clear();
          InternalRow first = ahead != null ? ahead : records.next().copy();
          ahead = null;
          group.add(first);
          boolean checked = !first.isNullAt(offset) && !first.isNullAt(copy);
          while (checked && records.hasNext()) {
            InternalRow r = records.next();
            if (r.isNullAt(offset) || r.isNullAt(copy) || r.getLong(offset) != first.getLong(offset)
                || !sameQueue(r, first)) {
              ahead = r.copy();
              break;
            }
            group.add(r.copy());
          }
          Object gap = first.isNullAt(offset) ? null : gapBefore(first);
          if (group.size() == 1) {
            return row(first, null, null, gap);
          }
          Object c0 = value(first, copy, copyType);
          boolean identical = true;
          for (InternalRow r : group) {
            identical &= same(c0, value(r, copy, copyType));
          }
          if (identical) {
            return row(first, group.size() - 1, null, gap);
          }
          UTF8String what = UTF8String.fromString(differences());
          for (int i = 0; i < group.size(); i++) {
            ready.add(row(group.get(i), null, what, i == 0 ? gap : null).copy());
          }
          return null;
        }

        /** Offsets missing between the last group of this queue and this one (null: none or a new queue). */
        private Object gapBefore(InternalRow r) {
          long o = r.getLong(offset);
          Object gap = null;
          if (last != null && sameQueue(r, last) && o - last.getLong(offset) > 1) {
            gap = o - last.getLong(offset) - 1;
          }
          last = r;  // a copy of its own: rows are copied as they are read
          return gap;
        }

        private boolean sameQueue(InternalRow a, InternalRow b) {
          for (int i = 0; i < queue.length; i++) {
            if (!same(value(a, queue[i], queueTypes[i]), value(b, queue[i], queueTypes[i]))) {
              return false;
            }
          }
          return true;
        }

        /** Which compared columns differ among the group's copies, with the values of a number column. */
        private String differences() {
          List<String> parts = new ArrayList<>();
          for (int i = 0; i < compared.length; i++) {
            Set<Object> seen = new TreeSet<>();  // the values of a number column, ascending
            boolean differs = false;
            Object v0 = value(group.get(0), compared[i], comparedTypes[i]);
            for (InternalRow r : group) {
              Object v = value(r, compared[i], comparedTypes[i]);
              differs |= !same(v0, v);
              if (v instanceof Long || v instanceof Integer) {
                seen.add(((Number) v).longValue());
              }
            }
            if (!differs) {
              continue;
            }
            boolean number = comparedTypes[i].equals(DataTypes.LongType) || comparedTypes[i].equals(DataTypes.IntegerType);
            if (number) {
              List<String> shown = new ArrayList<>();
              for (Object v : seen) {
                shown.add(String.valueOf(v));
              }
              parts.add(names[i] + " (" + String.join(", ", shown) + ")");
            } else {
              parts.add(names[i]);
            }
          }
          return String.join(", ", parts);
        }

        private InternalRow row(InternalRow r, Integer copies, UTF8String conflict, Object gap) {
          if (copies == null) {
            added.setNullAt(0);
          } else {
            added.setInt(0, copies);
          }
          added.update(1, conflict);
          if (gap == null) {
            added.setNullAt(2);
          } else {
            added.setLong(2, (Long) gap);
          }
          return project.apply(joined.apply(r, added));
        }
      };
    }
  }
}
