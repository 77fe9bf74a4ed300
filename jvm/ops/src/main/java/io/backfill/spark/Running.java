package io.backfill.spark;

import java.util.Arrays;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;

/**
 * A task's running values over its rows in processing order: {@code seq} (how many rows the counted column
 * marks true, this one included) and one running max of the timestamp per flag column (over the rows it
 * marks true: an operator's stream time).
 */
final class Running {
  private final int ts;
  private final int counted;
  private final int[] flags;
  private final long[] max;
  private final boolean[] set;
  private long seq;

  Running(int ts, int counted, int[] flags) {
    this.ts = ts;
    this.counted = counted;
    this.flags = flags;
    this.max = new long[flags.length];
    this.set = new boolean[flags.length];
  }

  int width() {
    return 1 + flags.length;
  }

  void reset() {
    seq = 0;
    Arrays.fill(set, false);
  }

  /** Takes r in, then writes seq at {@code at} and each running max after it into {@code out}. */
  void add(InternalRow r, GenericInternalRow out, int at) {
    if (!r.isNullAt(counted) && r.getBoolean(counted)) {
      seq++;
    }
    out.setLong(at, seq);
    boolean hasTs = !r.isNullAt(ts);
    long t = hasTs ? r.getLong(ts) : 0L;
    for (int i = 0; i < flags.length; i++) {
      if (hasTs && !r.isNullAt(flags[i]) && r.getBoolean(flags[i]) && (!set[i] || t > max[i])) {
        max[i] = t;
        set[i] = true;
      }
      if (set[i]) {
        out.setLong(at + 1 + i, max[i]);
      } else {
        out.setNullAt(at + 1 + i);
      }
    }
  }
}
