package io.backfill.spark;

import java.util.Objects;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.UTF8String;

/** Tells where a new task starts in rows that come grouped by task (a null task is a task of its own). */
final class TaskChange {
  private final int column;
  private final DataType type;
  private final boolean intTask;
  private boolean started;
  private boolean isNull;
  private int intValue;
  private Object value;

  TaskChange(int column, DataType type) {
    this.column = column;
    this.type = type;
    this.intTask = type.equals(DataTypes.IntegerType);
  }

  /** Whether r is of another task than the row before it (and remembers r's task). */
  boolean starts(InternalRow r) {
    boolean nowNull = r.isNullAt(column);
    boolean same;
    if (nowNull) {
      same = started && isNull;
    } else if (intTask) {
      int v = r.getInt(column);
      same = started && !isNull && v == intValue;
      intValue = v;
    } else {
      Object v = r.get(column, type);
      same = started && !isNull && Objects.equals(v, value);
      value = v instanceof UTF8String ? ((UTF8String) v).clone() : v;
    }
    started = true;
    isNull = nowNull;
    return !same;
  }
}
